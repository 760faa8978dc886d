"""The "jsonl" task: prompts and gold answers from JSON Lines files.

Each non-blank line is an object with a prompt field and an answer field (names
configurable); other fields are kept in `Prompt.meta`. A bad line fails the
load with the file, the line number and what is wrong, because a silently
skipped line is a silently different dataset.

Split: with a test file, train drops any prompt whose text is also in test (the
test file is the benchmark, so it is kept whole). Without one, a fraction of
the *distinct* prompt texts is held out, chosen by a seeded hash of the text:
deterministic, independent of line order, and never split across train/test.
"""

from __future__ import annotations

import json
import logging
import math
import random
from pathlib import Path
from typing import Any

from cadence.data.config import TaskConfig
from cadence.data.tasks import Extract, Prompt, Split, check_split, stable_hash

log = logging.getLogger(__name__)


class JsonlError(ValueError):
    """A JSONL file that cannot be used, with the place to fix it in the message."""


def load_jsonl(
    path: str | Path, prompt_field: str = "prompt", answer_field: str = "answer"
) -> list[Prompt]:
    """Read prompts from a JSONL file; raise `JsonlError` naming file and line on bad input.

    Answers may be strings or numbers (numbers are converted with `str`, so
    ``82`` becomes ``"82"``). Blank lines are skipped.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise JsonlError(f"{path}: file not found")
    prompts: list[Prompt] = []
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise JsonlError(
                    f"{where}: invalid JSON ({exc.msg} at column {exc.colno})"
                ) from None
            if not isinstance(record, dict):
                raise JsonlError(f"{where}: expected a JSON object, got {type(record).__name__}")
            prompts.append(
                _to_prompt(record, where, f"{path.stem}:{lineno}", prompt_field, answer_field)
            )
    if not prompts:
        raise JsonlError(f"{path}: no records")
    return prompts


def _to_prompt(
    record: dict[str, Any], where: str, prompt_id: str, prompt_field: str, answer_field: str
) -> Prompt:
    for name in (prompt_field, answer_field):
        if name not in record:
            raise JsonlError(f"{where}: missing field {name!r} (fields present: {sorted(record)})")
    text, answer = record[prompt_field], record[answer_field]
    if not isinstance(text, str):
        raise JsonlError(
            f"{where}: field {prompt_field!r} must be a string, got {type(text).__name__}"
        )
    if isinstance(answer, bool) or not isinstance(answer, str | int | float):
        raise JsonlError(
            f"{where}: field {answer_field!r} must be a string or number, got {type(answer).__name__}"
        )
    meta = {k: v for k, v in record.items() if k not in (prompt_field, answer_field)}
    return Prompt(id=prompt_id, text=text, answer=str(answer), meta=meta)


def split_holdout(
    prompts: list[Prompt], fraction: float, seed: int
) -> tuple[list[Prompt], list[Prompt]]:
    """(train, test): hold out ceil(fraction * distinct texts) texts, chosen by seeded hash."""
    texts = sorted({p.text for p in prompts}, key=lambda t: stable_hash("jsonl-holdout", seed, t))
    if len(texts) < 2:
        raise JsonlError("need at least 2 distinct prompts to hold out a test split")
    k = min(len(texts) - 1, max(1, math.ceil(fraction * len(texts))))
    held_out = set(texts[:k])
    test: list[Prompt] = []
    seen: set[str] = set()
    for p in prompts:  # one test prompt per held-out text, in file order
        if p.text in held_out and p.text not in seen:
            seen.add(p.text)
            test.append(p)
    train = [p for p in prompts if p.text not in held_out]
    return train, test


class JsonlTask:
    """Prompts from files; train cycles through reshuffled epochs to give any `n`."""

    default_reward = "exact_match"
    default_extract: Extract = "answer_tag"
    stop: tuple[str, ...] = ()

    def __init__(
        self,
        train: list[Prompt],
        test: list[Prompt],
        *,
        seed: int = 0,
        prompt_suffix: str = "",
        name: str = "jsonl",
    ) -> None:
        if not train:
            raise JsonlError("the train split is empty after removing test prompts")
        self.name = name
        self.seed = seed
        self.prompt_suffix = prompt_suffix
        self._train = train
        self._test = test

    @classmethod
    def from_config(cls, cfg: TaskConfig) -> JsonlTask:
        """Read the configured files and split them."""
        if cfg.train_file is None:
            raise JsonlError("task.name 'jsonl' needs task.train_file")
        rows = load_jsonl(cfg.train_file, cfg.prompt_field, cfg.answer_field)
        if cfg.test_file is not None:
            test = load_jsonl(cfg.test_file, cfg.prompt_field, cfg.answer_field)
            test_texts = {p.text for p in test}
            train = [p for p in rows if p.text not in test_texts]
            if len(train) < len(rows):
                log.warning(
                    "%s: dropped %d training prompts that also appear in %s",
                    cfg.train_file,
                    len(rows) - len(train),
                    cfg.test_file,
                )
        else:
            train, test = split_holdout(rows, cfg.test_fraction, cfg.seed)
        return cls(train, test, seed=cfg.seed, prompt_suffix=cfg.prompt_suffix, name=cfg.name)

    def _with_suffix(self, p: Prompt, prompt_id: str) -> Prompt:
        return Prompt(prompt_id, p.text + self.prompt_suffix, p.answer, dict(p.meta))

    def prompts(self, split: Split, n: int, seed: int | None = None) -> list[Prompt]:
        """Train: `n` prompts from seeded shuffles of the train rows (epoch > 0 ids get
        an ``@epoch`` suffix). Test: the first min(n, len) test rows, in file order."""
        split = check_split(split)
        seed = self.seed if seed is None else seed
        if split == "test":
            return [self._with_suffix(p, p.id) for p in self._test[:n]]
        out: list[Prompt] = []
        epoch = 0
        while len(out) < n:
            order = list(self._train)
            random.Random(stable_hash("jsonl", "train", seed, epoch)).shuffle(order)
            for p in order[: n - len(out)]:
                out.append(self._with_suffix(p, p.id if epoch == 0 else f"{p.id}@{epoch}"))
            epoch += 1
        return out
