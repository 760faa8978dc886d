"""What rollout hands the trainer: scored responses, grouped by prompt."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Sample:
    """One response to one prompt, with what the trainer needs to learn from it."""

    prompt_id: str
    group_id: int  # responses to the same prompt in the same step share it
    prompt_ids: list[int]
    response_ids: list[int]
    behaviour_logprobs: list[float]  # log mu(token) from the inference engine
    reward: float
    version: int  # policy version that started generating this response
    finish_reason: str
    response_text: str = ""
    finish_version: int | None = None  # policy version that wrote its last token (None: unknown)
    reward_error: str | None = None
    # Multi-turn episodes: 1 on the model's tokens, 0 on the environment's (observations appended
    # between turns). None: every response token is the model's.
    loss_mask: list[int] | None = None
    # Multi-turn episodes: each turn's reward on the turn's last model token, 0 elsewhere (aligned
    # with response_ids, sums to `reward`). None: `reward` sits on the last response token.
    token_rewards: list[float] | None = None


@dataclass
class Group:
    """All responses to one prompt; the unit GRPO-style advantages need."""

    group_id: int
    prompt_id: str
    samples: list[Sample] = field(default_factory=list)

    @property
    def version(self) -> int:
        """The oldest policy version among its responses: staleness is judged by it."""
        return min(s.version for s in self.samples)

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]
