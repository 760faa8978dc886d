"""What a simulated rollout worker has instead of a tokenizer, a task and a reward function.

Nothing in the scheduler reads token values or rewards' meaning: prompts need
only a length, and a reward only has to exist (dynamic filtering is off in the
simulator). These stand-ins give exactly that, and cost nothing.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from cadence.data.tasks import Prompt


@dataclass
class _Encoded:
    input_ids: list[int]


class LengthTokenizer:
    """Encodes any prompt to `length` token ids."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __call__(self, text: str) -> _Encoded:
        return _Encoded([1] * self.length)


def blank_prompts(count: int) -> list[Prompt]:
    return [Prompt(id=f"p{i}", text="", answer="") for i in range(count)]


@dataclass(frozen=True)
class LengthTurns:
    """The turn format of a simulated episode: a first observation of `prompt_ticks` ids and
    `observation_ticks` ids after every turn (what an environment's text would tokenise to)."""

    prompt_ticks: int
    observation_ticks: int

    def first(self, tokenizer: object, observation: str) -> list[int]:
        return [1] * self.prompt_ticks

    def after(self, tokenizer: object, output_ids: list[int], observation: str) -> list[int]:
        return [1] * self.observation_ticks


class TurnsEnv:
    """An async environment with no world: an episode ends after a number of steps drawn from
    [min_turns, max_turns]; each step's reward is a coin flip. Its steps take no time of their
    own: the latency wrapper (cadence/envs/latency.py) gives them theirs."""

    action_tag = "answer"

    def __init__(self, min_turns: int, max_turns: int, seed: int) -> None:
        self.min_turns, self.max_turns = min_turns, max_turns
        self._rng = random.Random(seed)
        self.left = 0

    async def reset(self, seed: int) -> tuple[str, dict]:
        self.left = self._rng.randint(self.min_turns, self.max_turns)
        return "", {}

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.left -= 1
        return "", float(self._rng.random() < 0.5), self.left <= 0, False, {}


def answer_text(_: object) -> str:
    """What a simulated turn says: an action the environment runner passes on."""
    return "<answer>act</answer>"
