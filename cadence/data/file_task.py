"""The "file" task: prompts and gold answers from the data files people already have.

`task.name=file` (``jsonl``, its old name, still works) reads `task.train_file` and
`task.test_file`: formats, globs and how rows are held are in cadence/data/sources.py, the
row layouts (verl, TRL, chat messages) and field paths in cadence/data/fields.py.

Loading is one validating pass over every row (cadence/data/text_keys.py): a bad row fails
the load with its file, row and field, because a silently skipped row is a silently
different dataset. The pass keeps 8 bytes a row, a seeded 64-bit key of the prompt text; a
row's content is read again only when it is drawn.

Split: with a test file, train drops any row whose prompt text is also in test (the test
file is the benchmark, so it is kept whole). Without one, a fraction of the *distinct*
prompt texts is held out: those with the smallest keys, so the split is deterministic,
independent of row order, and never splits a text across train and test (the same split
as the older jsonl task; its train order was a `random.shuffle`, now numpy's permutation).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence

import numpy as np

from cadence.data.config import TaskConfig
from cadence.data.fields import DataFileError, Layout, read_prompt, resolve_layout
from cadence.data.sources import RowFile, by_part, find_files, open_file
from cadence.data.tasks import Extract, Prompt, Split, check_split, stable_hash
from cadence.data.text_keys import file_keys

log = logging.getLogger(__name__)

class RowSet:
    """The rows of several files under one 0-based index, each file read in its own layout."""

    def __init__(self, files: list[RowFile], layouts: list[Layout]) -> None:
        self.files, self.layouts = files, layouts
        self.starts = np.cumsum([0] + [len(f) for f in files])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def text_keys(self, seed: int) -> np.ndarray:
        """Validate every row; the seeded key of each row's prompt text, in row order."""
        return np.concatenate([file_keys(f, layout, seed) for f, layout in zip(self.files, self.layouts, strict=True)])

    def prompts(self, rows: Sequence[int] | np.ndarray) -> list[Prompt]:
        """The prompts of `rows` (indices into this set), in that order, each file read once."""
        out: list[Prompt] = [None] * len(rows)  # type: ignore[list-item]
        for f, picks, local in by_part(self.starts, rows):
            file, layout = self.files[f], self.layouts[f]
            for i, row, record in zip(picks, local, file.take(local), strict=True):
                out[i] = read_prompt(record, layout, file.where(row), file.row_id(row))
        return out


def open_rows(spec: str | list[str], cfg: TaskConfig, field: str) -> RowSet:
    """The files `spec` names, each with the layout its columns and the config give it."""
    try:
        found = find_files(spec, cfg.format, field)
    except ValueError as err:
        raise DataFileError(str(err)) from None
    files = [open_file(path, fmt) for path, fmt in found]
    layouts = [
        resolve_layout(cfg.preset, cfg.prompt_field, cfg.answer_field, f.columns(), str(f.path))
        for f in files
    ]
    return RowSet(files, layouts)


def hold_out(keys: np.ndarray, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, test rows): the ceil(fraction * distinct) texts with the smallest keys are
    held out, each by its first row in file order; train is every row of the other texts."""
    distinct, first = np.unique(keys, return_index=True)  # sorted by key
    if len(distinct) < 2:
        raise DataFileError("need at least 2 distinct prompts to hold out a test split")
    k = min(len(distinct) - 1, max(1, math.ceil(fraction * len(distinct))))
    test = np.sort(first[:k])
    train = np.flatnonzero(~np.isin(keys, distinct[:k]))
    return train, test


def with_suffix(p: Prompt, suffix: str, prompt_id: str) -> Prompt:
    """`p` with `suffix` after its text and after its last user message (a chat prompt)."""
    messages = None
    if p.messages is not None:
        messages = [dict(m) for m in p.messages]
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        messages[users[-1] if users else -1]["content"] += suffix
    return Prompt(prompt_id, p.text + suffix, p.answer, dict(p.meta), messages)


class FileTask:
    """Prompts from files; train cycles through reshuffled epochs to give any `n`."""

    default_reward = "exact_match"
    default_extract: Extract = "answer_tag"
    stop: tuple[str, ...] = ()

    def __init__(
        self,
        train: RowSet,
        train_rows: np.ndarray,
        test: RowSet,
        test_rows: np.ndarray,
        *,
        seed: int = 0,
        prompt_suffix: str = "",
        name: str = "file",
    ) -> None:
        if len(train_rows) == 0:
            raise DataFileError("the train split is empty after removing test prompts")
        self.name = name
        self.seed = seed
        self.prompt_suffix = prompt_suffix
        self._train, self._train_rows = train, train_rows
        self._test, self._test_rows = test, test_rows
        self._orders: dict[tuple[int, int], np.ndarray] = {}
        # (seed, the longest train draw so far): a run asks for the first n prompts again with
        # n one block (3,200) longer each time, so only the new ones are read from the files.
        self._drawn: tuple[int, list[Prompt]] = (seed, [])

    @classmethod
    def from_config(cls, cfg: TaskConfig) -> FileTask:
        """Read and validate the configured files and split them (cached: `cadence train` checks
        the data before the model loads and builds the task after, in the same process)."""
        if cfg.train_file is None:
            raise DataFileError("task.name 'file' needs task.train_file")
        split = _load_split(cfg.model_dump_json(), _stamps(cfg))
        return cls(*split, seed=cfg.seed, prompt_suffix=cfg.prompt_suffix, name=cfg.name)

    def _order(self, seed: int, epoch: int) -> np.ndarray:
        """A seeded shuffle of the train rows' positions for one epoch (the last few kept): numpy's,
        milliseconds for a million rows where `random.shuffle` takes a second."""
        if (seed, epoch) not in self._orders:
            order = np.random.default_rng(stable_hash("jsonl", "train", seed, epoch)).permutation(len(self._train_rows))
            if len(self._orders) >= 4:
                self._orders.pop(next(iter(self._orders)))
            self._orders[seed, epoch] = order
        return self._orders[seed, epoch]

    def prompts(self, split: Split, n: int, seed: int | None = None) -> list[Prompt]:
        """Train: `n` prompts from seeded shuffles of the train rows (epoch > 0 ids get
        an ``@epoch`` suffix). Test: the first min(n, len) test rows, in file order."""
        split = check_split(split)
        seed = self.seed if seed is None else seed
        if split == "test":
            return [with_suffix(p, self.prompt_suffix, p.id) for p in self._test.prompts(self._test_rows[:n])]
        drawn = self._drawn[1] if self._drawn[0] == seed else []
        if len(drawn) < n:
            drawn = drawn + self._draw(seed, len(drawn), n)
            self._drawn = (seed, drawn)
        return drawn[:n]

    def _draw(self, seed: int, start: int, stop: int) -> list[Prompt]:
        """Positions [start, stop) of the endless train stream: epoch after reshuffled epoch."""
        if stop <= start:
            return []
        size = len(self._train_rows)
        first, last = start // size, (stop - 1) // size
        orders = np.concatenate([self._order(seed, epoch) for epoch in range(first, last + 1)])
        positions = np.arange(start, stop)
        prompts = self._train.prompts(self._train_rows[orders[positions - first * size]])
        return [
            with_suffix(p, self.prompt_suffix, p.id if epoch == 0 else f"{p.id}@{epoch}")
            for p, epoch in zip(prompts, (positions // size).tolist(), strict=True)
        ]


def _stamps(cfg: TaskConfig) -> tuple:
    """What identifies the files' contents for the cache: each path's size and modification time."""
    specs = [cfg.train_file, cfg.test_file]
    try:
        paths = [p for spec in specs if spec is not None for p, _ in find_files(spec, cfg.format, "task")]
    except ValueError as err:
        raise DataFileError(str(err)) from None
    return tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in paths)


@functools.lru_cache(maxsize=1)
def _load_split(config_json: str, stamps: tuple) -> tuple[RowSet, np.ndarray, RowSet, np.ndarray]:
    cfg = TaskConfig.model_validate_json(config_json)
    train = open_rows(cfg.train_file, cfg, "task.train_file")  # type: ignore[arg-type]
    keys = train.text_keys(cfg.seed)
    if cfg.test_file is None:
        train_rows, test_rows = hold_out(keys, cfg.test_fraction)
        return train, train_rows, train, test_rows
    test = open_rows(cfg.test_file, cfg, "task.test_file")
    train_rows = np.flatnonzero(~np.isin(keys, test.text_keys(cfg.seed)))
    if len(train_rows) == 0:
        raise DataFileError(f"{cfg.train_file}: every prompt also appears in {cfg.test_file}; none is left to train on")
    if len(train_rows) < len(train):
        log.warning(
            "%s: dropped %d training prompts that also appear in %s",
            cfg.train_file, len(train) - len(train_rows), cfg.test_file,
        )
    return train, train_rows, test, np.arange(len(test))
