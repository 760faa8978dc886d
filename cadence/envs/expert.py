"""Scripted experts and the demonstrations they play, for a supervised warm-up.

FrozenLake and Sokoban know a shortest solution from any state
(`expert_action()`: breadth-first search on the true state). `demonstrate`
plays an episode with it through the environment's own `step`, so a
demonstration is a real trajectory: the observations the policy would see and
responses in the action format it must learn (``<answer>Right</answer>``).

A demonstrator can be made sloppy on purpose (`slip`): on that share of its
turns it plays its environment's habitual mistake instead of the expert move,
so a model warmed up on the demonstrations keeps the habit and RL has
something to remove (the built-in arithmetic model forgets to carry the one
the same way). FrozenLake's habit is walking as if there were no holes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
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


def hole_blind_action(env: Any) -> str | None:
    """FrozenLake's habitual mistake: the first move of a shortest path that ignores the holes."""
    from cadence.envs.frozenlake import ACTIONS, shortest_path

    path = shortest_path([row.replace("H", "F") for row in env.desc], env.state)
    return ACTIONS[path[0]] if path else None


HABITS: dict[str, Callable[[Any], str | None]] = {"FrozenLakeEnv": hole_blind_action}


def demonstrate(
    env: Any,
    seed: int,
    max_turns: int = 100,
    tag: str | None = "answer",
    slip: float = 0.0,
    rng: random.Random | None = None,
    short: bool = False,
) -> Demonstration:
    """Play one episode of `env` (with an `expert_action()` method) from `seed`.

    A reply is the move in `<tag>...</tag>`, or bare with `tag=None` (for
    `env.action_tag=null`); `short`: the move's first letter ("D" for Down).
    With `slip` > 0, each turn plays the environment's habitual mistake
    (`HABITS`) instead with that probability, drawn from `rng`.
    """
    if not hasattr(env, "expert_action"):
        raise TypeError(f"{type(env).__name__} has no expert_action(): no scripted expert for it")
    habit = HABITS.get(type(env).__name__)
    if slip > 0 and habit is None:
        raise ValueError(f"{type(env).__name__} has no habitual mistake to slip into; use slip=0")
    rng = rng or random.Random(seed)
    observation, _ = env.reset(seed)
    demo = Demonstration(seed)
    for _ in range(max_turns):
        action = env.expert_action()
        if action is None:  # no way to win from here (a slippery lake can strand you)
            break
        if slip > 0 and rng.random() < slip:
            action = habit(env) or action
        move = action[0] if short else action
        response = f"<{tag}>{move}</{tag}>" if tag else move
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
    name: str,
    seeds: Iterable[int],
    kwargs: dict[str, Any] | None = None,
    max_turns: int = 100,
    slip: float = 0.0,
    tag: str | None = "answer",
    short: bool = False,
) -> list[Demonstration]:
    """Expert episodes of built-in env `name` ('frozenlake' or 'sokoban'), one per seed;
    `slip`, `tag` and `short` as in `demonstrate`."""
    from cadence.envs.registry import resolve_env_class

    env = resolve_env_class(name)(**(kwargs or {}))
    return [
        demonstrate(env, seed, max_turns, tag=tag, slip=slip, rng=random.Random(seed), short=short) for seed in seeds
    ]
