"""The environment contract: gymnasium's reset/step semantics with text in and text out.

A user's environment is any class with

    reset(self, seed: int) -> tuple[str, dict]
        the first observation (the task, shown to the policy) and an info dict;
    step(self, action: str) -> tuple[str, float, bool, bool, dict]
        observation, reward, terminated, truncated, info after the policy's action:
        terminated = the task ended (solved, failed), truncated = cut short from
        outside (a turn or time limit); the episode is over when either is true;

optionally ``async def`` versions of both, and ``close()`` (sync or async) to free
what the environment holds. The same instance is reset again for the next
episode; `EnvRunner` replaces it after a failure. Sync methods run in a thread
of their own, so they may block (a subprocess, a socket); async methods run on
the event loop and must not block it.

A class may say which tag its actions come in with a class attribute
``action_tag = "answer"`` (the runner then passes the text inside the last
``<answer>...</answer>`` of the response to `step`), or ``action_tag = None``
(the whole response). An optional static ``check_config(**kwargs)`` runs when the
config loads and raises ValueError for settings that cannot work (a missing
package, an unknown game id), so they fail before anything loads.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol, runtime_checkable

StepReturn = tuple[str, float, bool, bool, dict[str, Any]]
ResetReturn = tuple[str, dict[str, Any]]


@runtime_checkable
class TextEnv(Protocol):
    """A synchronous text environment (see the module docstring for the semantics)."""

    def reset(self, seed: int) -> ResetReturn: ...

    def step(self, action: str) -> StepReturn: ...


@runtime_checkable
class AsyncTextEnv(Protocol):
    """The same contract with coroutines: for environments that wait on I/O or a service."""

    async def reset(self, seed: int) -> ResetReturn: ...

    async def step(self, action: str) -> StepReturn: ...


def contract_problems(cls: type) -> list[str]:
    """What keeps `cls` from being an environment class, in words (empty: it is one)."""
    if not isinstance(cls, type):
        return [f"it is a {type(cls).__name__}, not a class"]
    problems = []
    for method, args in (("reset", (None, 0)), ("step", (None, ""))):
        fn = getattr(cls, method, None)
        if fn is None or not callable(fn):
            problems.append(f"it has no {method}() method")
            continue
        try:
            inspect.signature(fn).bind(*args)
        except TypeError:
            wanted = "seed: int" if method == "reset" else "action: str"
            problems.append(f"{method}() must take ({wanted})")
        except ValueError:
            pass  # no introspectable signature: trust it
    return problems


def check_step_return(value: Any) -> StepReturn:
    """`value` as a well-formed step result; TypeError naming what is wrong otherwise."""
    if not isinstance(value, tuple) or len(value) != 5:
        raise TypeError(
            "step() must return (observation, reward, terminated, truncated, info), got "
            f"{type(value).__name__}{f' of length {len(value)}' if isinstance(value, tuple) else ''}"
        )
    obs, reward, terminated, truncated, info = value
    if not isinstance(obs, str):
        raise TypeError(f"step() observation must be a str, got {type(obs).__name__}")
    try:
        reward = float(reward)
    except (TypeError, ValueError):
        raise TypeError(f"step() reward must be a number, got {reward!r}") from None
    if reward != reward or reward in (float("inf"), float("-inf")):
        raise TypeError(f"step() reward must be finite, got {reward}")
    return obs, reward, bool(terminated), bool(truncated), dict(info or {})


def check_reset_return(value: Any) -> ResetReturn:
    """`value` as a well-formed reset result; TypeError naming what is wrong otherwise."""
    if not isinstance(value, tuple) or len(value) != 2 or not isinstance(value[0], str):
        raise TypeError(f"reset() must return (observation: str, info: dict), got {value!r:.80}")
    return value[0], dict(value[1] or {})


class EnvDied(RuntimeError):
    """Raised by an environment whose backing process or service is gone (kind 'died')."""
