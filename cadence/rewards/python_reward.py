"""A user's reward function, named ``python:target:function`` in reward.name.

`RewardConfig` checks the spec at load time through `resolve_python_reward`, so
this module needs nothing of the config.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from cadence.python_spec import PYTHON_PREFIX, load_python_object

if TYPE_CHECKING:
    from cadence.data.tasks import Prompt
    from cadence.rewards.verifiers import RewardFn


def resolve_python_reward(spec: str) -> RewardFn:
    """Import the function a ``python:target:function`` spec names; ValueError says why not.

    `target` is a module path (``pkg.rewards``) or a file (``/abs/rewards.py``,
    ``./rewards.py``). The function must accept ``(prompt, response)``.
    """
    where = f"reward.name {spec!r}"
    fn = load_python_object(spec, where, kind="function")
    target, _, func_name = spec.removeprefix(PYTHON_PREFIX).rpartition(":")
    if not callable(fn):
        raise ValueError(f"{where}: {target}.{func_name} is a {type(fn).__name__}, not a function")
    try:
        inspect.signature(fn).bind(None, "")
    except TypeError as exc:
        raise ValueError(f"{where}: {func_name} must accept (prompt, response): {exc}") from None
    except ValueError:
        pass  # no introspectable signature (some builtins): trust it
    return fn


class PythonReward:
    """A user function named by a ``python:`` spec; pickles as the spec, re-imported on use."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self._fn: RewardFn | None = resolve_python_reward(spec)

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "_fn": None}

    def __call__(self, prompt: Prompt, response: str) -> float:
        if self._fn is None:
            self._fn = resolve_python_reward(self.spec)
        return self._fn(prompt, response)
