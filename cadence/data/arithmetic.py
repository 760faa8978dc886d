"""The built-in "arith" task: "37+45=" -> "82", sized for a tiny char-level model.

Why this task: a ~1M-parameter model with a byte-level tokenizer can learn it
on a CPU in minutes, so the whole RL loop (SFT warm-up, rollouts, rewards,
updates) can be exercised and *seen to improve* without a GPU or a model hub.

End-of-answer convention: an answer is followed by `TERMINATOR` ("\\n"). SFT
completions end with it, and the task's `stop` strings are `(TERMINATOR,)`, so
a sampler that stops on them ends exactly where the warm-up taught the model
to end. The built-in reward for this task is exact match on the last number
of the first line.

Two ways to answer. SFT completions are either the bare sum ("1112") or, for a
`cot_fraction` of them, worked column addition ending in the sum
("3+9=12,2+8+1=11,1+9+1=11,1112"). A tiny model answers far more accurately
when it works the columns, but after a warm-up on mostly bare answers it
rarely chooses to: which way to answer is what RL on this task learns first,
a small-scale version of RL teaching a model to reason before answering.
"""

from __future__ import annotations

import random
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from cadence.data.config import TaskConfig
from cadence.data.tasks import Extract, Prompt, Split, check_split, stable_hash

TERMINATOR = "\n"
"""Ends every arith answer: the SFT completion suffix and the sampler's stop string."""

Operation = Literal["+", "-", "*"]


class ArithOptions(BaseModel):
    """`task.kwargs` for "arith"."""

    model_config = ConfigDict(extra="forbid")

    operations: list[Operation] = Field(
        default_factory=lambda: ["+"],
        min_length=1,
        description="Operators to sample from; '-' may give negative answers.",
    )
    digits: int = Field(3, ge=1, le=9, description="Operands are uniform in [0, 10**digits - 1].")
    cot_fraction: float = Field(
        0.25,
        ge=0.0,
        le=1.0,
        description="Share of SFT completions that show worked column addition before "
        "the answer ('+' only; other operators are always answered directly).",
    )

    @field_validator("operations")
    @classmethod
    def _unique(cls, ops: list[Operation]) -> list[Operation]:
        if len(set(ops)) != len(ops):
            raise ValueError(f"operations must not repeat, got {ops}")
        return ops

    @property
    def space(self) -> int:
        """Number of distinct problems."""
        return (10**self.digits) ** 2 * len(self.operations)


def parse_arith_options(kwargs: dict) -> ArithOptions:
    """Validate `task.kwargs` with messages that name the config path."""
    try:
        return ArithOptions(**kwargs)
    except ValidationError as exc:
        problems = "; ".join(
            f"task.kwargs.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()
        )
        raise ValueError(f"invalid 'arith' options: {problems}") from None


def check_arith_config(kwargs: dict, test_size: int) -> None:
    """Fail at load time if the options are invalid or leave too few training problems."""
    options = parse_arith_options(kwargs)
    if test_size > options.space // 2:
        raise ValueError(
            f"task.test_size={test_size} would hold out more than half of the "
            f"{options.space} distinct 'arith' problems; lower it or raise task.kwargs.digits"
        )


class ArithmeticTask:
    """Random "a<op>b=" problems; the test split is a fixed held-out sample."""

    default_reward = "exact_match"
    default_extract: Extract = "last_number"
    stop = (TERMINATOR,)

    def __init__(
        self,
        options: ArithOptions | None = None,
        *,
        test_size: int = 200,
        seed: int = 0,
        prompt_suffix: str = "",
        name: str = "arith",
    ) -> None:
        self.options = options or ArithOptions()
        self.test_size = test_size
        self.seed = seed
        self.prompt_suffix = prompt_suffix
        self.name = name
        self._test_cache: dict[int, list[int]] = {}

    @classmethod
    def from_config(cls, cfg: TaskConfig) -> ArithmeticTask:
        """Build from a validated `TaskConfig` named "arith"."""
        return cls(
            parse_arith_options(cfg.kwargs),
            test_size=cfg.test_size,
            seed=cfg.seed,
            prompt_suffix=cfg.prompt_suffix,
            name=cfg.name,
        )

    # Problems are integers in [0, space): cheap to sample, hash and exclude.
    def _decode(self, index: int) -> tuple[int, str, int]:
        ops = self.options.operations
        base = 10**self.options.digits
        rest, op = divmod(index, len(ops))
        b, a = divmod(rest, base)
        return a, ops[op], b

    def _prompt(self, index: int, prompt_id: str) -> Prompt:
        a, op, b = self._decode(index)
        value = a + b if op == "+" else a - b if op == "-" else a * b
        return Prompt(
            id=prompt_id,
            text=f"{a}{op}{b}={self.prompt_suffix}",
            answer=str(value),
            meta={"a": a, "op": op, "b": b},
        )

    def _test_indices(self, seed: int) -> list[int]:
        if seed not in self._test_cache:
            rng = random.Random(stable_hash("arith", "test", seed))
            self._test_cache[seed] = rng.sample(range(self.options.space), self.test_size)
        return self._test_cache[seed]

    def _train_indices(self, n: int, seed: int, stream: str) -> list[int]:
        held_out = set(self._test_indices(seed))
        rng = random.Random(stable_hash("arith", stream, seed))
        out: list[int] = []
        while len(out) < n:  # terminates: the config keeps >= half the space out of test
            index = rng.randrange(self.options.space)
            if index not in held_out:
                out.append(index)
        return out

    def prompts(self, split: Split, n: int, seed: int | None = None) -> list[Prompt]:
        """Train: `n` random problems (repeats possible), none in test. Test: the first
        min(n, test_size) of a fixed sample of `test_size` distinct problems."""
        split = check_split(split)
        seed = self.seed if seed is None else seed
        if split == "test":
            indices = self._test_indices(seed)[:n]
        else:
            indices = self._train_indices(n, seed, "train")
        return [self._prompt(i, f"arith-{split}-{seed}-{k}") for k, i in enumerate(indices)]

    def sft_examples(self, n: int, seed: int | None = None) -> list[tuple[str, str]]:
        """(prompt, completion) pairs for supervised warm-up, never from the test split.

        The completion is the answer followed by `TERMINATOR`, which teaches the
        model to end its answer where the sampler's stop string cuts it.
        """
        seed = self.seed if seed is None else seed
        rng = random.Random(stable_hash("arith", "sft-style", seed))
        out = []
        for k, index in enumerate(self._train_indices(n, seed, "sft")):
            prompt = self._prompt(index, f"arith-sft-{seed}-{k}")
            a, op, b = self._decode(index)
            answer = prompt.answer
            if op == "+" and rng.random() < self.options.cot_fraction:
                answer = f"{worked_sum(a, b)},{answer}"
            out.append((prompt.text, answer + TERMINATOR))
        return out


def worked_sum(a: int, b: int) -> str:
    """Column addition, ones first: worked_sum(123, 989) == "3+9=12,2+8+1=11,1+9+1=11"."""
    steps, carry = [], 0
    da, db = str(a)[::-1], str(b)[::-1]
    for i in range(max(len(da), len(db))):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        total = x + y + carry
        steps.append(f"{x}+{y}+{carry}={total}" if carry else f"{x}+{y}={total}")
        carry = total // 10
    return ",".join(steps)
