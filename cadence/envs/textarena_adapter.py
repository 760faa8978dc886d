"""Single-player TextArena games as text environments (optional extra ``envs-textarena``).

``env.name=textarena env.kwargs.id=GuessTheNumber-v0`` plays any one-player
game of ``pip install 'cadence[envs-textarena]'``. TextArena's own prompts say
how to format a move (``[5]``, ``[e2e4]``), so the whole response is the
action (`action_tag = None`); the game parses it. Each observation is the game
messages since the last turn (the game's "-raw" variant, without TextArena's
history-repeating wrappers: the episode loop keeps the conversation). The
reward is the game's reward for player 0 when it ends (win 1, loss or invalid
move usually 0 or -1, by game).
"""

from __future__ import annotations

import difflib
from typing import Any

from cadence.envs.contract import ResetReturn, StepReturn

INSTALL = "pip install 'cadence[envs-textarena]'"


def _import_textarena() -> Any:
    try:
        import textarena
    except ImportError as exc:
        raise ImportError(f"the textarena environment needs TextArena: {INSTALL}") from exc
    return textarena


class TextArenaEnv:
    """One player against a TextArena game (see the module docstring)."""

    action_tag = None

    @staticmethod
    def check_config(id: str, make_kwargs: dict[str, Any] | None = None) -> None:  # noqa: A002
        """Config-time check (no game is made): the extra is installed and knows the game."""
        try:
            from textarena.envs.registration import ENV_REGISTRY
        except ImportError:
            raise ValueError(f"env.name=textarena needs TextArena: {INSTALL}") from None
        if id not in ENV_REGISTRY and f"{id}-raw" not in ENV_REGISTRY:
            close = difflib.get_close_matches(id, list(ENV_REGISTRY), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"env.kwargs.id: TextArena has no game {id!r}{hint}")

    def __init__(self, id: str, make_kwargs: dict[str, Any] | None = None) -> None:  # noqa: A002
        ta = _import_textarena()
        from textarena.envs.registration import ENV_REGISTRY

        raw = id if id.endswith("-raw") else f"{id}-raw"
        if raw not in ENV_REGISTRY and id not in ENV_REGISTRY:
            raise ValueError(f"TextArena has no game {id!r}")
        self.id = raw if raw in ENV_REGISTRY else id
        self.make_kwargs = dict(make_kwargs or {})
        self.env = ta.make(self.id, **self.make_kwargs)
        self._shown = ""  # for wrapped games whose observation is the whole history as text
        self._closed = False

    def _observe(self) -> str:
        player, messages = self.env.get_observation()
        if isinstance(messages, str):  # a wrapped game: show only what is new
            new = messages.removeprefix(self._shown) if messages.startswith(self._shown) else messages
            self._shown = messages
            return new.strip()
        # (sender, text, type); the player's own move comes back too: it knows what it said
        return "\n".join(text for sender, text, *_ in messages if sender != player).strip()

    def reset(self, seed: int) -> ResetReturn:
        if self._closed:
            self.env = _import_textarena().make(self.id, **self.make_kwargs)
            self._closed = False
        self._shown = ""
        self.env.reset(num_players=1, seed=seed)
        return self._observe(), {}

    def step(self, action: str) -> StepReturn:
        done, info = self.env.step(action)
        text = self._observe()
        if not done:
            return text, 0.0, False, False, dict(info or {})
        rewards, game_info = self.env.close()
        self._closed = True
        end = (game_info or {}).get(0, {})
        reason = end.get("reason", "")
        text = f"{text}\n{reason}".strip()
        return text, float((rewards or {}).get(0, 0.0)), True, False, dict(end)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self.env.close()
            except Exception:  # noqa: S110 - closing a game mid-way may fail in some games
                pass
