"""The validating pass over a data file: every row checked, a 64-bit key per row kept.

`read_prompt` (cadence/data/fields.py) is the one definition of a valid row and of every
error message. Python is too slow to run it on a million rows in seconds, so rows that
Arrow can prove valid in bulk (right types, not null, not empty) skip it; any other row,
and every row of a file Arrow cannot read in one schema, goes through `read_prompt`,
which either raises the row's one-line error or returns its text.

The key of a row is a seeded 64-bit hash of its prompt text (`hash_texts`): equal texts get
equal keys (for de-duplication and the held-out split), and the seed reorders which texts
sort first.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from cadence.data.fields import LAST_ASSISTANT, ROLES, Layout, read_prompt
from cadence.data.sources import SCAN_BATCH, RowFile

HOLDOUT = "jsonl-holdout"  # the keys' salt: held-out sets stay those of the older jsonl task


def hash_texts(texts: list[str], seed: int) -> np.ndarray:
    """`stable_hash(HOLDOUT, seed, text)` of each text, as uint64 (blake2b; about 1 us a text)."""
    prefix = f"{HOLDOUT}\x1f{seed}\x1f".encode()
    digests = b"".join(hashlib.blake2b(prefix + t.encode(), digest_size=8).digest() for t in texts)
    return np.frombuffer(digests, dtype=">u8").astype(np.uint64)


def _field(batch: Any, path: str) -> Any:
    """The Arrow column of a field path in a record batch, or None when it is not one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if path in batch.schema.names:
        return batch.column(path)
    parts = path.split(".")
    if parts[0] not in batch.schema.names:
        return None
    column = batch.column(parts[0])
    for part in parts[1:]:
        if not pa.types.is_struct(column.type) or column.type.get_field_index(part) < 0:
            return None
        column = pc.struct_field(column, part)
    return column


def proven_texts(batch: Any, layout: Layout) -> Any:
    """The prompt texts of a record batch, null for each row Arrow cannot prove valid."""
    import pyarrow as pa
    import pyarrow.compute as pc

    prompt = _field(batch, layout.prompt)
    answer = _field(batch, layout.answer) if layout.answer != LAST_ASSISTANT else None
    nothing = pa.nulls(batch.num_rows, pa.string())
    if prompt is None or answer is None:
        return nothing
    if pa.types.is_string(prompt.type) or pa.types.is_large_string(prompt.type):
        texts = prompt
    elif pa.types.is_list(prompt.type) and _is_message_struct(prompt.type.value_type):
        messages = prompt.flatten()  # this batch's messages (`values` would be the whole table's)
        roles, contents = pc.struct_field(messages, "role"), pc.struct_field(messages, "content")
        good = pc.fill_null(pc.and_(pc.is_in(roles, pa.array(ROLES)), pc.is_valid(contents)), False)
        parents = pc.list_parent_indices(prompt).to_numpy()
        bad_rows = np.bincount(parents[~good.to_numpy(zero_copy_only=False)], minlength=batch.num_rows) > 0
        # offsets index the whole table's messages, so the contents list reads from all of them
        contents = pa.ListArray.from_arrays(prompt.offsets, pc.struct_field(prompt.values, "content"))
        ok = pc.and_(pc.greater(pc.list_value_length(prompt), 0), pa.array(~bad_rows))
        texts = pc.if_else(ok, pc.binary_join(contents, "\n\n"), None)
    else:
        return nothing
    ok = pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(texts)), 0)
    if pa.types.is_string(answer.type) or pa.types.is_large_string(answer.type):
        ok = pc.and_(ok, pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(answer)), 0))
    elif pa.types.is_integer(answer.type) or pa.types.is_floating(answer.type):
        ok = pc.and_(ok, pc.is_valid(answer))
    else:
        return nothing
    return pc.if_else(pc.fill_null(ok, False), texts, None)


def _is_message_struct(kind: Any) -> bool:
    import pyarrow as pa

    return (
        pa.types.is_struct(kind)
        and kind.get_field_index("role") >= 0
        and kind.get_field_index("content") >= 0
        and pa.types.is_string(kind.field("role").type)
        and pa.types.is_string(kind.field("content").type)
    )


def file_keys(file: RowFile, layout: Layout, seed: int) -> np.ndarray:
    """Validate every row of `file`; the key of each row's prompt text, in row order."""
    import pyarrow as pa

    keys = np.empty(len(file), dtype=np.uint64)
    row = 0
    try:
        for batch in file.arrow_batches():
            texts = proven_texts(batch, layout).to_pylist()
            if None in texts:
                _fill_in(texts, file, layout, row)
            keys[row : row + batch.num_rows] = hash_texts(texts, seed)
            row += batch.num_rows
    except pa.ArrowInvalid:  # JSONL whose rows do not share one schema: read_prompt reads it all
        row = 0
    for start in range(row, len(file), SCAN_BATCH):
        rows = range(start, min(start + SCAN_BATCH, len(file)))
        texts = [read_prompt(r, layout, file.where(i), "").text for i, r in zip(rows, file.take(rows), strict=True)]
        keys[rows.start : rows.stop] = hash_texts(texts, seed)
    return keys


def _fill_in(texts: list[str | None], file: RowFile, layout: Layout, start: int) -> None:
    """Fill each unproven row's text in from `read_prompt` (which raises on a bad row)."""
    missing = [i for i, text in enumerate(texts) if text is None]
    for i, record in zip(missing, file.take([start + i for i in missing]), strict=True):
        texts[i] = read_prompt(record, layout, file.where(start + i), "").text
