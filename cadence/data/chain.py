"""The built-in "chain" task: keep adding the step until you pass 100. Long-tailed answers.

    "37+08="  ->  "45, 45+08=53, 53+08=61, 61+08=69, 69+08=77, 77+08=85, 85+08=93, 93+08=101"

The prompt is an "arith" problem ``a+b=``; the answer writes the sum, then adds
``b`` again to the running total, one worked step at a time, until the total
reaches 100 or more; the gold answer is that total (the reward takes the last
number of the first line). The number of steps is ``ceil((100 - a) / b)``:
one for most problems, 30 and more for a small start and step, so answer
lengths are long-tailed (median ~24 characters, longest ~330 with
`step_min` 3) like the reasoning traces that make synchronous RL wait for its
slowest sample (SPEC section 1). Each step is a two-digit sum the built-in
model already knows, so a short SFT warm-up (`cadence/configs/sft_chain.yaml`)
teaches the format; the warmed-up model still slips on long chains, which is
what RL then improves.
"""

from __future__ import annotations

from cadence.data.arithmetic import TERMINATOR
from cadence.data.config import TaskConfig
from cadence.data.options import LIMIT, ChainOptions, parse_chain_options
from cadence.data.tasks import Extract, Prompt, Split, check_split, held_out_indices, train_indices


def chain_answer(a: int, b: int) -> tuple[str, int]:
    """The worked answer (with its terminator) and the final total for start `a`, step `b`."""
    total = a + b
    steps = [f"{total:02d}"]
    while total < LIMIT:
        steps.append(f"{total:02d}+{b:02d}={total + b:02d}")
        total += b
    return ", ".join(steps) + TERMINATOR, total


def answer_budget(kwargs: dict) -> int:
    """Characters in the longest worked answer the options allow: a token budget that cuts none.

    A token is at most one character for the built-in byte-level tokenizer, and
    usually several for others, so this never truncates a gold answer.
    """
    step = parse_chain_options(kwargs).step_min
    return max(len(chain_answer(a, step)[0]) for a in range(LIMIT))


class AdditionChainTask:
    """Random "a+b=" chain problems; the test split is a fixed held-out sample."""

    default_reward = "exact_match"
    default_extract: Extract = "last_number"
    stop = (TERMINATOR,)

    def __init__(self, options: ChainOptions | None = None, *, test_size: int = 200, seed: int = 0,
                 prompt_suffix: str = "", name: str = "chain") -> None:
        self.options = options or ChainOptions()
        self.test_size = test_size
        self.seed = seed
        self.prompt_suffix = prompt_suffix
        self.name = name

    @classmethod
    def from_config(cls, cfg: TaskConfig) -> AdditionChainTask:
        """Build from a validated `TaskConfig` named "chain"."""
        return cls(parse_chain_options(cfg.kwargs), test_size=cfg.test_size, seed=cfg.seed,
                   prompt_suffix=cfg.prompt_suffix, name=cfg.name)

    def _decode(self, index: int) -> tuple[int, int]:
        step, a = divmod(index, LIMIT)
        return a, self.options.step_min + step

    def _prompt(self, index: int, prompt_id: str) -> Prompt:
        a, b = self._decode(index)
        _, total = chain_answer(a, b)
        text = f"{a:02d}+{b:02d}={self.prompt_suffix}"
        return Prompt(id=prompt_id, text=text, answer=str(total), meta={"a": a, "b": b})

    def _indices(self, split: Split, n: int, seed: int, stream: str = "train") -> list[int]:
        test = held_out_indices("chain", self.options.space, self.test_size, seed)
        if split == "test":
            return test[:n]
        return train_indices("chain", self.options.space, n, seed, stream, set(test))

    def prompts(self, split: Split, n: int, seed: int | None = None) -> list[Prompt]:
        """Train: `n` random problems (repeats possible), none in test. Test: the first
        min(n, test_size) of a fixed sample of `test_size` distinct problems."""
        split = check_split(split)
        seed = self.seed if seed is None else seed
        return [self._prompt(i, f"chain-{split}-{seed}-{k}") for k, i in enumerate(self._indices(split, n, seed))]

    def sft_examples(self, n: int, seed: int | None = None) -> list[tuple[str, str]]:
        """(prompt, worked answer) pairs for the supervised warm-up, never from the test split."""
        seed = self.seed if seed is None else seed
        out = []
        for index in self._indices("train", n, seed, stream="sft"):
            a, b = self._decode(index)
            out.append((f"{a:02d}+{b:02d}={self.prompt_suffix}", chain_answer(a, b)[0]))
        return out
