"""`EnvRunner`: one async interface over any environment, for the episode loop.

The episode loop runs one coroutine per episode; each holds an `EnvRunner`:

    runner = EnvRunner.from_config(cfg.env)
    first = await runner.reset(seed)          # ResetResult | EnvFailure
    step = await runner.step(response_text)   # StepResult | EnvFailure
    ...                                       # until step.done
    await runner.close()

What it does for the loop:

* sync environments run in a daemon thread of the runner's own (never the
  event loop's, never a shared pool that one hung environment could fill), so
  a slow `step` does not stop other episodes; async ones run on the loop;
* every reset/step has a timeout; a raise, a timeout or a dead environment
  comes back as an `EnvFailure` (counted in `counts`), never as an exception:
  that episode is lost, the rollout goes on. The environment is closed and the
  next `reset` builds a fresh one;
* the action is taken out of the response (``<answer>...</answer>``); a
  response without one is not passed to the environment but answered with the
  format and a `format_penalty`; the episode is truncated after `max_turns`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import queue
import sysconfig
import threading
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from cadence.envs.actions import extract_action, format_hint
from cadence.envs.contract import EnvDied, check_reset_return, check_step_return

# Frames in these folders are ours or Python's: a failure's traceback starts after them.
_NOT_USER = (os.path.dirname(os.path.abspath(__file__)) + os.sep, sysconfig.get_paths()["stdlib"] + os.sep)

T = TypeVar("T")

FailureKind = Literal["raised", "timeout", "died"]


@dataclass
class EnvFailure:
    """An episode lost to its environment: `kind` raised | timeout | died, during make | reset | step."""

    kind: FailureKind
    during: Literal["make", "reset", "step"]
    message: str
    done: bool = True  # lets the loop test `result.done` without telling the two apart first
    traceback: str = ""  # of a raised failure, from the environment's own code on


@dataclass
class ResetResult:
    observation: str
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepResult:
    """One turn: the environment's answer plus what the runner added.

    `action` is what reached `step()` (None after a format error, when nothing did);
    `reward` includes the format penalty; `truncated` includes the turn limit.
    """

    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    action: str | None
    format_error: bool = False

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


class _Worker:
    """One daemon thread running calls in order: the environment keeps its thread.

    Daemon, and not a ThreadPoolExecutor, because the interpreter joins executor
    threads at exit: one environment that never returns would hang the whole run's exit.
    """

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._calls.put((future, fn, args))
        return future

    def stop(self) -> None:
        self._calls.put(None)  # the thread exits once its current call (if any) returns

    def _run(self) -> None:
        while (item := self._calls.get()) is not None:
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to the awaiting coroutine
                future.set_exception(exc)


def _checked(method: Callable[..., Any], check: Callable[[Any], Any]) -> Callable[..., Any]:
    """`method` with its return value checked, and of the same kind (sync or async) as it.

    The kind decides where `EnvRunner` runs it: sync in the worker thread, async on the loop.
    """
    if inspect.iscoroutinefunction(method):

        async def checked_async(*args: Any) -> Any:
            return check(await method(*args))

        return checked_async
    return lambda *args: check(method(*args))


def _close_quietly(env: Any) -> None:
    """Close a discarded environment in a thread of its own: it may be stuck mid-step."""
    close = getattr(env, "close", None)
    if close is None:
        return

    def run() -> None:
        try:
            result = close()
            if inspect.isawaitable(result):
                asyncio.run(result)
        except Exception:  # noqa: S110 - a broken environment failing to close changes nothing
            pass

    threading.Thread(target=run, name="cadence-env-close", daemon=True).start()


def _close_late_env(made: concurrent.futures.Future) -> None:
    if not made.cancelled() and made.exception() is None:
        _close_quietly(made.result())


async def _within(seconds: float, pending: Awaitable[T]) -> T:
    """`await pending`, or TimeoutError after `seconds`.

    Not `asyncio.wait_for`: on Python 3.11, a wait_for cancelled in the loop round in which
    its awaitable finished returns the result and drops the cancellation. An episode cancelled
    just as its environment call returned then played on into its next turn, on a hub that had
    stopped serving, and the worker's stop waited for it for ever.
    """
    async with asyncio.timeout(seconds):
        return await pending


def _user_traceback(exc: BaseException) -> str:
    """The traceback from the first frame outside cadence/envs and the standard library."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename.startswith(_NOT_USER):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


class EnvRunner:
    """Runs episodes of one environment at a time (see the module docstring)."""

    def __init__(
        self,
        make_env: Callable[[], Any],
        *,
        step_timeout_s: float = 30.0,
        max_turns: int | None = None,
        action_tag: str | None = "answer",
        format_penalty: float = 0.0,
    ) -> None:
        self.make_env = make_env
        self.step_timeout_s = step_timeout_s
        self.max_turns = max_turns
        self.action_tag = action_tag
        self.format_penalty = format_penalty
        self.counts: Counter[str] = Counter()  # episodes, steps, format_errors, failures/<kind>
        self.turns = 0
        self._env: Any = None
        self._worker: _Worker | None = None
        self._in_episode = False
        self._in_thread: concurrent.futures.Future | None = None  # the latest call in the worker

    @classmethod
    def from_config(cls, cfg: Any) -> EnvRunner:
        """A runner for an `EnvConfig` (its name, kwargs, latency, limits and action format)."""
        from cadence.envs.build import env_factory
        from cadence.envs.registry import default_action_tag, resolve_env_class

        tag = cfg.action_tag
        if tag == "auto":
            tag = default_action_tag(resolve_env_class(cfg.name))
        return cls(
            env_factory(cfg),
            step_timeout_s=cfg.step_timeout_s,
            max_turns=cfg.max_turns,
            action_tag=tag,
            format_penalty=cfg.format_penalty,
        )

    @property
    def env(self) -> Any:
        """The live environment (None before the first reset and after a failure)."""
        return self._env

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if inspect.iscoroutinefunction(fn):
            pending = fn(*args)
        else:
            assert self._worker is not None
            self._in_thread = self._worker.submit(fn, *args)
            pending = asyncio.wrap_future(self._in_thread)
        return await _within(self.step_timeout_s, pending)

    async def _guarded(self, during: str, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) under the timeout; an `EnvFailure` (env discarded) instead of any error."""
        try:
            return await self._call(fn, *args)
        except asyncio.CancelledError:
            self._discard()  # cancelled mid-call by the loop: the env's state is unknown now
            raise
        except TimeoutError:
            kind, message = "timeout", f"{during} took longer than {self.step_timeout_s:g} s"
        except EnvDied as exc:
            kind, message = "died", f"{during}: {exc}"
        except (Exception, SystemExit) as exc:  # sys.exit() in an env ends its episode only
            kind, message = "raised", f"{during}: {type(exc).__name__}: {exc}"
            trace = _user_traceback(exc)
        if during == "make" and self._in_thread is not None and not self._in_thread.done():
            # A constructor past its timeout may still finish: close what it makes then.
            self._in_thread.add_done_callback(_close_late_env)
        self.counts[f"failures/{kind}"] += 1
        self._discard()
        return EnvFailure(kind, during, message, traceback=trace if kind == "raised" else "")  # type: ignore[arg-type]

    def _discard(self) -> None:
        if self._env is not None:
            _close_quietly(self._env)
        if self._worker is not None:
            self._worker.stop()
        self._env, self._worker, self._in_episode = None, None, False

    async def reset(self, seed: int) -> ResetResult | EnvFailure:
        """Start an episode (building the environment first if there is none)."""
        if self._env is None:
            self._worker = _Worker(f"cadence-env-{id(self):x}")
            made = await self._guarded("make", self.make_env)
            if isinstance(made, EnvFailure):
                return made
            self._env = made
        result = await self._guarded("reset", _checked(self._env.reset, check_reset_return), seed)
        if isinstance(result, EnvFailure):
            return result
        self.counts["episodes"] += 1
        self.turns, self._in_episode = 0, True
        return ResetResult(*result)

    async def step(self, response: str) -> StepResult | EnvFailure:
        """One policy turn: take the action out of `response` and step the environment."""
        if not self._in_episode:
            raise RuntimeError("step() outside an episode: call reset(seed) first (again after done)")
        self.turns += 1
        self.counts["steps"] += 1
        action = extract_action(response, self.action_tag)
        if action is None:
            self.counts["format_errors"] += 1
            result = StepResult(
                format_hint(self.action_tag or ""), -self.format_penalty, False, False,
                {"format_error": True}, None, format_error=True,
            )  # fmt: skip
        else:
            step = _checked(self._env.step, check_step_return)
            returned = await self._guarded("step", step, action)
            if isinstance(returned, EnvFailure):
                return returned
            result = StepResult(*returned, action=action)
        if self.max_turns is not None and self.turns >= self.max_turns and not result.terminated:
            result.truncated = True
        if result.done:
            self._in_episode = False
        return result

    async def close(self) -> None:
        """Close the environment (waits up to the step timeout) and stop its thread."""
        env, worker = self._env, self._worker
        self._env, self._worker, self._in_episode = None, None, False
        close = getattr(env, "close", None)
        try:
            if close is not None and worker is not None:
                if inspect.iscoroutinefunction(close):
                    await _within(self.step_timeout_s, close())
                else:
                    await _within(self.step_timeout_s, asyncio.wrap_future(worker.submit(close)))
        except Exception:  # noqa: S110 - closing is best effort; the env is dropped either way
            pass
        finally:
            if worker is not None:
                worker.stop()
