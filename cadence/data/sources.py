"""Data files: find what `task.train_file` names, and read rows without holding them as Python objects.

A file is one of: JSON Lines (``.jsonl``, ``.ndjson``, or ``.json`` that is not one array),
a JSON array (``.json``), parquet, CSV (a header row; every cell read as text, so ``007``
stays ``007``), or a folder written by `datasets`' ``save_to_disk``. `task.format` overrides
the extension.

How rows are held, so a large file is in memory at most once and never as Python rows:
JSONL keeps an index of line offsets and parses a line when its row is drawn; parquet and
CSV are read into an Arrow table; a `datasets` folder is memory-mapped (its Arrow files,
as `datasets` itself does); a JSON array is parsed whole (keep large data in the others).
"""

from __future__ import annotations

import csv
import glob
import json
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from cadence.data.fields import DataFileError

FileFormat = Literal["auto", "jsonl", "json", "parquet", "csv", "datasets"]
EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
SCAN_BATCH = 4096  # rows per batch of a validating pass (cadence/data/text_keys.py)


def find_files(spec: str | list[str], fmt: FileFormat, field: str) -> list[tuple[Path, str]]:
    """Each file `spec` names (paths or globs, in order; a glob's matches sorted) with its format.

    Cheap (no file is read beyond a folder's marker or a .json's first byte): run at config
    load. ValueError naming `field` (e.g. ``task.train_file``) and the fix.
    """
    found = []
    for text in [spec] if isinstance(spec, str) else spec:
        path = Path(text).expanduser()
        if any(c in text for c in "*?["):
            matches = sorted(Path(p) for p in glob.glob(str(path)))
            if not matches:
                raise ValueError(f"{field}: no file matches {text}")
        elif not path.exists():
            raise ValueError(f"{field}: file not found: {text}")
        else:
            matches = [path]
        found += [(m, file_format(m, fmt, field)) for m in matches]
    if not found:
        raise ValueError(f"{field}: an empty list names no file")
    return found


def file_format(path: Path, fmt: FileFormat, field: str) -> str:
    """The format of one path: a `datasets` folder, `fmt` when set, else by extension."""
    if path.is_dir():
        splits_file = path / "dataset_dict.json"
        if splits_file.is_file():
            splits = json.loads(splits_file.read_text())["splits"]
            raise ValueError(
                f"{field}: {path} holds the splits {splits} of a datasets DatasetDict; point it at "
                f"one split's folder, e.g. {path / splits[0]}"
            )
        if not (path / "state.json").is_file():
            raise ValueError(f"{field}: {path} is a folder, but not one written by datasets' save_to_disk")
        return "datasets"
    if fmt == "auto":
        fmt = EXTENSIONS.get(path.suffix.lower())  # type: ignore[assignment]
        if fmt is None:
            raise ValueError(
                f"{field}: cannot tell the format of {path} from its extension; name it .jsonl, "
                ".json, .parquet or .csv, or set task.format (jsonl, json, parquet, csv)"
            )
    if fmt == "datasets":
        raise ValueError(f"{field}: task.format=datasets needs a folder written by save_to_disk, got {path}")
    if fmt == "json" and _first_byte(path) != b"[":  # many .json files are JSON Lines
        return "jsonl"
    return fmt


def _first_byte(path: Path) -> bytes:
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(4096), b""):
            stripped = chunk.lstrip()
            if stripped:
                return stripped[:1]
    return b""


class RowFile(Protocol):
    """Rows of one data file, by 0-based row number."""

    path: Path

    def __len__(self) -> int: ...

    def columns(self) -> list[str]:
        """The top-level field names (a JSONL file: its first row's)."""
        ...

    def where(self, row: int) -> str:
        """The row as an error message names it (JSONL: file:line)."""
        ...

    def row_id(self, row: int) -> str:
        """`Prompt.id` of the row."""
        ...

    def arrow_batches(self) -> Iterator[Any]:
        """Every row in order as Arrow record batches, for a validating pass; nothing when the
        file has no Arrow form; pyarrow.ArrowInvalid when its rows do not share one schema."""
        ...

    def take(self, rows: Sequence[int]) -> list[dict[str, Any]]:
        """Whole rows, in the order asked."""
        ...


def open_file(path: Path, fmt: str) -> RowFile:
    """A reader for a file `find_files` returned."""
    if fmt == "jsonl":
        return JsonlFile(path)
    if fmt == "json":
        return ListFile(path, _json_array(path))
    return TableFile(path, _read_table(path, fmt))


class JsonlFile:
    """JSON Lines with an index of line offsets: a row is parsed when it is drawn."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offsets, self._lines = array("q"), array("q")
        offset = 0
        with path.open("rb") as handle:
            for lineno, line in enumerate(handle, start=1):
                if line.strip():  # blank lines are not rows
                    self._offsets.append(offset)
                    self._lines.append(lineno)
                offset += len(line)
        if not self._offsets:
            raise DataFileError(f"{path}: no records")

    def __len__(self) -> int:
        return len(self._offsets)

    def columns(self) -> list[str]:
        return list(self.take([0])[0])

    def where(self, row: int) -> str:
        return f"{self.path}:{self._lines[row]}"

    def row_id(self, row: int) -> str:
        return f"{self.path.stem}:{self._lines[row]}"

    def _parse(self, line: bytes, row: int) -> dict[str, Any]:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataFileError(f"{self.where(row)}: invalid JSON ({exc.msg} at column {exc.colno})") from None
        except UnicodeDecodeError as exc:
            raise DataFileError(f"{self.where(row)}: not UTF-8 text ({exc.reason})") from None
        if not isinstance(record, dict):
            raise DataFileError(f"{self.where(row)}: expected a JSON object, got {type(record).__name__}")
        return record

    def arrow_batches(self) -> Iterator[Any]:
        import pyarrow.json as pj

        yield from pj.open_json(self.path)  # batches of non-blank lines, as the index counts them

    def take(self, rows: Sequence[int]) -> list[dict[str, Any]]:
        out = []
        with self.path.open("rb") as handle:
            for row in rows:
                handle.seek(self._offsets[row])
                out.append(self._parse(handle.readline(), row))
        return out


class ListFile:
    """Rows parsed whole (a JSON array file)."""

    def __init__(self, path: Path, rows: list[dict[str, Any]]) -> None:
        self.path, self._rows = path, rows

    def __len__(self) -> int:
        return len(self._rows)

    def columns(self) -> list[str]:
        return list(self._rows[0])

    def where(self, row: int) -> str:
        return f"{self.path} row {row + 1}"

    def row_id(self, row: int) -> str:
        return f"{self.path.stem}:{row + 1}"

    def arrow_batches(self) -> Iterator[Any]:
        return iter(())

    def take(self, rows: Sequence[int]) -> list[dict[str, Any]]:
        return [self._rows[row] for row in rows]


def _json_array(path: Path) -> list[dict[str, Any]]:
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataFileError(f"{path}: invalid JSON ({exc})") from None
    if not isinstance(rows, list) or not rows:
        raise DataFileError(f"{path}: expected a non-empty JSON array of objects")
    for row, record in enumerate(rows, start=1):
        if not isinstance(record, dict):
            raise DataFileError(f"{path} row {row}: expected a JSON object, got {type(record).__name__}")
    return rows


def by_part(starts: np.ndarray, rows: Sequence[int]) -> Iterator[tuple[int, np.ndarray, list[int]]]:
    """Rows numbered across consecutive parts that begin at `starts`, grouped by part:
    (part, positions in `rows`, row numbers within the part)."""
    rows = np.asarray(rows, dtype=np.int64)
    which = np.searchsorted(starts, rows, side="right") - 1
    for part in np.unique(which):
        picks = np.flatnonzero(which == part)
        yield int(part), picks, (rows[picks] - starts[part]).tolist()


class TableFile(ListFile):
    """Rows of an Arrow table (parquet, CSV, a memory-mapped `datasets` folder)."""

    def __init__(self, path: Path, table: Any) -> None:
        if table.num_rows == 0:
            raise DataFileError(f"{path}: no records")
        self.path, self._table = path, table
        # Rows are taken batch by batch: Table.take on a table of several row groups
        # concatenates each column first, a copy of the whole table (+207 MB at 1M rows).
        self._batches = table.to_batches()
        self._starts = np.cumsum([0] + [b.num_rows for b in self._batches])

    def __len__(self) -> int:
        return self._table.num_rows

    def columns(self) -> list[str]:
        return list(self._table.column_names)

    def arrow_batches(self) -> Iterator[Any]:
        return iter(self._table.to_batches(max_chunksize=SCAN_BATCH))

    def take(self, rows: Sequence[int]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{}] * len(rows)
        for batch, picks, local in by_part(self._starts, rows):
            for i, record in zip(picks, self._batches[batch].take(local).to_pylist(), strict=True):
                out[i] = record
        return out


def _read_table(path: Path, fmt: str) -> Any:
    import pyarrow as pa

    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path)
        if fmt == "csv":
            return _read_csv(path)
        if fmt == "datasets":
            state = json.loads((path / "state.json").read_text())
            streams = [pa.ipc.open_stream(pa.memory_map(str(path / f["filename"]))) for f in state["_data_files"]]
            return pa.concat_tables([s.read_all() for s in streams])
    except (pa.ArrowException, OSError, KeyError) as exc:
        raise DataFileError(f"{path}: cannot read it as {fmt} ({type(exc).__name__}: {exc})") from None
    raise ValueError(f"unknown data file format {fmt!r}")


def _read_csv(path: Path) -> Any:
    """A CSV file with every column read as text (a type guess would turn ``007`` into ``7``)."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    with path.open(newline="", encoding="utf-8") as handle:
        header = next(csv.reader(handle), None)
    if not header:
        raise DataFileError(f"{path}: no header row")
    options = pcsv.ConvertOptions(column_types=dict.fromkeys(header, pa.string()), strings_can_be_null=False)
    return pcsv.read_csv(path, convert_options=options)
