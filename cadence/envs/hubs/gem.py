"""GEM environments (``gem-llm``, what ROLL and ROCK train on): ``env.name=gem:<GEM id>``.

    env.name=gem:game:GuessTheNumber-v0-easy   env.name=gem:rg:leg_counting   env.name=gem:math:GSM8K

GEM's environments already speak text: ``reset(seed) -> (observation, info)``
and ``step(action) -> (observation, reward, terminated, truncated, info)``, and
they parse the whole response themselves (``\\boxed{...}`` for games and math),
so the whole response is the action (`action_tag = None`). ``env.kwargs`` go to
``gem.make(id, **kwargs)`` over the id's registered defaults (``max_turns=4``).
The raw environment is used, without GEM's history-concatenating wrappers:
cadence's episode keeps the conversation itself.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

from cadence.envs.contract import ResetReturn, StepReturn
from cadence.envs.hubs import bind_id, unknown_id

# GEM seeds an episode through the process-wide `random` and numpy generators
# (gem.utils.seeding.set_seed), then draws the game from them: two episodes reset
# at once in two threads would draw from each other's seed. One reset at a time.
_RESET_LOCK = threading.Lock()


def _import_gem() -> Any:
    # `import gem` calls logging.basicConfig(level=INFO), which would print every INFO
    # line of the whole process; a handler on the root logger makes that call a no-op.
    root = logging.getLogger()
    guard = logging.NullHandler()
    root.addHandler(guard)
    try:
        import gem
    finally:
        root.removeHandler(guard)
    return gem


class GemEnv:
    """One GEM environment (see the module docstring); `gem_id` is set by `env_class`."""

    action_tag = None
    gem_id = ""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.env = _import_gem().make(self.gem_id, **kwargs)

    def reset(self, seed: int) -> ResetReturn:
        # A fresh environment per episode (gem.make takes about a millisecond): some carry
        # state across resets (a reasoning-gym env draws from a new dataset every `size`
        # resets), and a group's episodes, played on different instances, must match.
        self.close()
        self.env = _import_gem().make(self.gem_id, **self.kwargs)
        with _RESET_LOCK:
            obs, info = self.env.reset(seed=seed)
        return str(obs), dict(info or {})

    def step(self, action: str) -> StepReturn:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return str(obs), float(reward), bool(terminated), bool(truncated), dict(info or {})

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


@functools.cache
def env_class(gem_id: str) -> type:
    """The environment class of ``gem:<gem_id>``; ValueError naming the closest ids if GEM has none."""
    _import_gem()  # first: it registers GEM's environments (and guards the logging)
    from gem.envs.registration import ENV_REGISTRY

    if gem_id not in ENV_REGISTRY:
        raise unknown_id(f"gem:{gem_id}", gem_id, ENV_REGISTRY, "python -c 'import gem; gem.print_envs()'")
    return bind_id(GemEnv, "gem_id", gem_id)
