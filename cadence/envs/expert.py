"""Scripted experts and the demonstrations they play, for a supervised warm-up.

FrozenLake and Sokoban know a shortest solution from any state
(`expert_action()`: breadth-first search on the true state). `demonstrate`
plays an episode with it through the environment's own `step`, so a
demonstration is a real trajectory: the observations the policy would see and
responses in the action format it must learn (``<answer>Right</answer>``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Turn:
    observation: str  # what the policy saw before this response
    response: str  # the expert's reply, in the action format
    reward: float


@dataclass
class Demonstration:
    seed: int
    turns: list[Turn] = field(default_factory=list)
    final_observation: str = ""
    total_reward: float = 0.0
    solved: bool = False  # the episode terminated with a positive reward

    def messages(self) -> list[dict[str, str]]:
        """Chat messages (user = observation, assistant = response) for SFT."""
        out = []
        for turn in self.turns:
            out += [
                {"role": "user", "content": turn.observation},
                {"role": "assistant", "content": turn.response},
            ]
        return out


def demonstrate(env: Any, seed: int, max_turns: int = 100, tag: str = "answer") -> Demonstration:
    """Play one episode of `env` (with an `expert_action()` method) from `seed`."""
    if not hasattr(env, "expert_action"):
        raise TypeError(f"{type(env).__name__} has no expert_action(): no scripted expert for it")
    observation, _ = env.reset(seed)
    demo = Demonstration(seed)
    for _ in range(max_turns):
        action = env.expert_action()
        if action is None:  # no way to win from here (a slippery lake can strand you)
            break
        response = f"<{tag}>{action}</{tag}>"
        next_observation, reward, terminated, truncated, _ = env.step(action)
        demo.turns.append(Turn(observation, response, float(reward)))
        demo.total_reward += float(reward)
        observation = next_observation
        if terminated or truncated:
            demo.solved = terminated and reward > 0
            break
    demo.final_observation = observation
    return demo


def demonstrations(
    name: str, seeds: Iterable[int], kwargs: dict[str, Any] | None = None, max_turns: int = 100
) -> list[Demonstration]:
    """Expert episodes of built-in env `name` ('frozenlake' or 'sokoban'), one per seed."""
    from cadence.envs.registry import resolve_env_class

    env = resolve_env_class(name)(**(kwargs or {}))
    return [demonstrate(env, seed, max_turns) for seed in seeds]
