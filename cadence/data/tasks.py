"""Prompt sources: what the policy is asked, and the gold answer a reward checks.

A `Task` turns a `TaskConfig` into lists of `Prompt`s for a split. Every task
keeps its train and test splits disjoint *for the same seed* (a test prompt's
text never appears in train), so that evaluation measures generalisation and
not recall. Tasks are built by name through `cadence.data.build.build_task`; see
`cadence.data.config.TaskConfig` for the naming scheme.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Split = Literal["train", "test"]
SPLITS: tuple[Split, ...] = ("train", "test")

# How a built-in reward pulls the answer out of a response, when RewardConfig
# says "auto": each task names the convention its prompts ask for.
Extract = Literal["none", "first_line", "answer_tag", "last_number", "boxed", "gsm8k"]


@dataclass
class Prompt:
    """One question for the policy.

    `meta` must stay JSON-serialisable (it is logged and may cross process
    boundaries); for reasoning-gym it carries the dataset entry the scorer needs.
    `messages` is the prompt as chat messages (`[{"role": ..., "content": ...}]`) when the
    source gives it that way (verl/TRL rows); `text` then holds their plain-text form. A
    chat-template model renders `messages` when set, else `text` as one user turn.
    """

    id: str
    text: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] | None = None


@runtime_checkable
class Task(Protocol):
    """A source of prompts with a disjoint train/test split.

    Attributes:
        name: the config name the task was built from (e.g. "arith", "rg:countdown").
        default_reward: reward name used when `reward.name` is "auto".
        default_extract: how built-in rewards extract the answer when
            `reward.extract` is "auto".
        stop: strings that end an answer; the sampler should stop on them.
            Empty when the task relies on the model's EOS token.
    """

    name: str
    default_reward: str
    default_extract: Extract
    stop: tuple[str, ...]

    def prompts(self, split: Split, n: int, seed: int | None = None) -> list[Prompt]:
        """Prompts of `split`, deterministic in `seed` (None: the config's seed).

        Train returns exactly `n` (cycling or resampling as needed); test returns
        at most `n`, because the test split has a fixed size.
        """
        ...


def check_split(split: str) -> Split:
    """Fail early on a mistyped split: a silent fallback would leak test into train."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return split  # type: ignore[return-value]


def stable_hash(*parts: object) -> int:
    """A 64-bit hash that, unlike `hash()`, is the same in every process and run."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def held_out_indices(key: str, space: int, size: int, seed: int) -> list[int]:
    """A fixed sample of `size` distinct problem indices in [0, space): a generated task's test split."""
    return random.Random(stable_hash(key, "test", seed)).sample(range(space), size)


def train_indices(key: str, space: int, n: int, seed: int, stream: str, held_out: set[int]) -> list[int]:
    """`n` random problem indices (repeats possible) outside `held_out`; `stream` names the draw.

    Terminates because the tasks' configs keep at least half of the space out of the test split.
    """
    rng = random.Random(stable_hash(key, stream, seed))
    out: list[int] = []
    while len(out) < n:
        index = rng.randrange(space)
        if index not in held_out:
            out.append(index)
    return out
