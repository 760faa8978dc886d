"""The built-in "arith" task: "37+45=" -> "82", sized for a tiny char-level model.

Why this task: a ~1M-parameter model with a byte-level tokenizer can learn it
on a CPU in minutes, so the whole RL loop (SFT warm-up, rollouts, rewards,
updates) can be exercised and *seen to improve* without a GPU or a model hub.

End-of-answer convention: an answer is followed by `TERMINATOR` ("\\n"). SFT
completions end with it, and the task's `stop` strings are `(TERMINATOR,)`, so
a sampler that stops on them ends exactly where the warm-up taught the model
to end. The built-in reward for this task is exact match on the last number
of the first line.

A warm-up with a habit to unlearn. `sft_carry_slip` makes a share of the SFT
answers to carrying problems forget to carry the one ("37+45=" -> "72"), like
a sloppy annotator. With a slip rate above one half the warmed-up model
prefers the slip on carrying problems, and greedy decoding repeats it; RL
against the exact-match verifier is what removes the habit. The held-out
test answers are always correct.
"""

from __future__ import annotations

import random

from cadence.data.config import TaskConfig
from cadence.data.options import ArithOptions, parse_arith_options
from cadence.data.tasks import (
    Extract,
    Prompt,
    Split,
    check_split,
    held_out_indices,
    stable_hash,
    train_indices,
)

TERMINATOR = "\n"
"""Ends every arith answer: the SFT completion suffix and the sampler's stop string."""

class ArithmeticTask:
    """Random "a<op>b=" problems; the test split is a fixed held-out sample."""

    default_reward = "exact_match"
    default_extract: Extract = "first_line"
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
            text=f"{self._operand(a)}{op}{self._operand(b)}={self.prompt_suffix}",
            answer=str(value),
            meta={"a": a, "op": op, "b": b},
        )

    def _operand(self, x: int) -> str:
        # Fixed-width operands put every digit at a fixed position: a tiny model then learns
        # the column rule far sooner than when it must first find where each number starts.
        return str(x).zfill(self.options.digits) if self.options.pad_operands else str(x)

    def _test_indices(self, seed: int) -> list[int]:
        if seed not in self._test_cache:
            self._test_cache[seed] = held_out_indices("arith", self.options.space, self.test_size, seed)
        return self._test_cache[seed]

    def _train_indices(self, n: int, seed: int, stream: str) -> list[int]:
        return train_indices("arith", self.options.space, n, seed, stream, set(self._test_indices(seed)))

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
        rng = random.Random(stable_hash("arith", "sft-slip", seed))
        out = []
        for k, index in enumerate(self._train_indices(n, seed, "sft")):
            prompt = self._prompt(index, f"arith-sft-{seed}-{k}")
            a, op, b = self._decode(index)
            answer = prompt.answer
            slipped = sum_without_carries(a, b) if op == "+" else None
            if slipped is not None and slipped != a + b and rng.random() < self.options.sft_carry_slip:
                answer = str(slipped)
            out.append((prompt.text, answer + TERMINATOR))
        return out


def sum_without_carries(a: int, b: int) -> int:
    """What someone who never carries the one writes: 37+45 -> 72, 58+67 -> 115.

    Every column keeps only its own last digit; the top column writes its whole sum.
    """
    da, db = str(a)[::-1], str(b)[::-1]
    columns = [
        (int(da[i]) if i < len(da) else 0) + (int(db[i]) if i < len(db) else 0)
        for i in range(max(len(da), len(db)))
    ]
    return int(str(columns[-1]) + "".join(str(c % 10) for c in reversed(columns[:-1])))
