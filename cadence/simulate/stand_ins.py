"""What a simulated rollout worker has instead of a tokenizer, a task and a reward function.

Nothing in the scheduler reads token values or rewards' meaning: prompts need
only a length, and a reward only has to exist (dynamic filtering is off in the
simulator). These stand-ins give exactly that, and cost nothing.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from cadence.data.tasks import Prompt
from cadence.rewards.guard import RewardOutcome


@dataclass
class _Encoded:
    input_ids: list[int]


class LengthTokenizer:
    """Encodes any prompt to `length` token ids."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __call__(self, text: str) -> _Encoded:
        return _Encoded([1] * self.length)


class CoinReward:
    """Scores a response 1 or 0 at random (seeded); the time it takes is not modelled."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def score(self, pairs: list[tuple[Prompt, str]]) -> list[RewardOutcome]:
        return [RewardOutcome(float(self._rng.random() < 0.5)) for _ in pairs]


def blank_prompts(count: int) -> list[Prompt]:
    return [Prompt(id=f"p{i}", text="", answer="") for i in range(count)]
