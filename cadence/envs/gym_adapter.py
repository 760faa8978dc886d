"""Any gymnasium environment as a text environment (`env.name=gymnasium env.kwargs.id=...`).

The observation is the environment's text rendering (``render_mode="ansi"``,
ANSI colour codes stripped) when it has one, else its observation as text
(a ``Text`` space's string as it is). Actions: a ``Discrete`` space takes a
name from `actions` (or its first letter, or the index as a number); a
``Text`` space takes the action text as it is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from cadence.envs.contract import ResetReturn, StepReturn

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_HIGHLIGHT = re.compile(r"\x1b\[4[0-7]m(.*?)\x1b\[0m", re.DOTALL)


def strip_ansi(text: str, mark_highlight: bool = False) -> str:
    """`text` without terminal colour/cursor codes.

    gymnasium's ansi renders show the agent by a background colour (FrozenLake's
    red cell); with `mark_highlight` such a cell becomes ``[S]`` instead of vanishing.
    """
    if mark_highlight:
        text = _HIGHLIGHT.sub(r"[\1]", text)
    return _ANSI.sub("", text)


def parse_discrete_action(action: str, names: Sequence[str]) -> int | None:
    """Index of `action` among `names`: the name, a unique first letter, or the index; else None.

    Case and surrounding whitespace/punctuation are ignored, so "left", "LEFT." and "L" all work.
    """
    text = action.strip().strip(".!'\"`").strip().lower()
    lowered = [name.lower() for name in names]
    if text in lowered:
        return lowered.index(text)
    initials = [name[:1] for name in lowered]
    if len(text) == 1 and initials.count(text) == 1:
        return initials.index(text)
    if text.isdigit() and int(text) < len(names):
        return int(text)
    return None


class GymnasiumEnv:
    """A gymnasium env id, made with ``render_mode="ansi"`` when it supports it."""

    action_tag = "answer"

    @staticmethod
    def check_config(id: str, **_: Any) -> None:  # noqa: A002
        """Config-time check (nothing is made): gymnasium knows the id."""
        import difflib

        import gymnasium as gym

        if id not in gym.registry:
            close = difflib.get_close_matches(id, list(gym.registry), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"env.kwargs.id: gymnasium has no environment {id!r}{hint}")

    def __init__(
        self,
        id: str,  # noqa: A002 - gymnasium's own name for it
        actions: list[str] | None = None,
        make_kwargs: dict[str, Any] | None = None,
    ) -> None:
        import gymnasium as gym

        try:
            gym.spec(id)
        except gym.error.Error as exc:
            raise ValueError(f"gymnasium has no environment {id!r}: {exc}") from None
        self.env = gym.make(id, **(make_kwargs or {}))
        self.render_mode = None
        if "ansi" in self.env.metadata.get("render_modes", ()):
            self.env.close()  # made again: the render mode is fixed at construction
            self.env = gym.make(id, render_mode="ansi", **(make_kwargs or {}))
            self.render_mode = "ansi"
        space = self.env.action_space
        if isinstance(space, gym.spaces.Discrete):
            self.names = list(actions) if actions else [str(i) for i in range(int(space.n))]
            if len(self.names) != int(space.n):
                raise ValueError(f"actions names {len(self.names)} actions; {id} has {space.n}")
        elif isinstance(space, gym.spaces.Text):
            self.names = None
        else:
            raise ValueError(
                f"{id}: action space {space} is neither Discrete nor Text; wrap it to one of those"
            )

    def _text(self, obs: Any) -> str:
        if self.render_mode == "ansi":
            return strip_ansi(str(self.env.render()), mark_highlight=True).strip("\n")
        return obs if isinstance(obs, str) else str(obs)

    def _actions_line(self) -> str:
        if self.names is None:
            return "Reply with your action in <answer>...</answer>."
        return f"Valid actions: {', '.join(self.names)}. Reply with one in <answer>...</answer>."

    def reset(self, seed: int) -> ResetReturn:
        obs, info = self.env.reset(seed=seed)
        return f"{self._text(obs)}\n{self._actions_line()}", dict(info)

    def step(self, action: str) -> StepReturn:
        if self.names is None:
            chosen: Any = action
        else:
            chosen = parse_discrete_action(action, self.names)
            if chosen is None:
                return f"Invalid action {action!r}. {self._actions_line()}", 0.0, False, False, {
                    "invalid_action": True
                }
        obs, reward, terminated, truncated, info = self.env.step(chosen)
        return self._text(obs), float(reward), bool(terminated), bool(truncated), dict(info)

    def close(self) -> None:
        self.env.close()
