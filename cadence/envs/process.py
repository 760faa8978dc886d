"""`ProcessEnv`: an environment hosted in a child process (``env.isolation=process``).

In the runner's thread a crash of native code (a segfault, ``os._exit``) or a
runaway allocation takes the trainer down with it, and a step that hangs keeps
its thread forever. In a child process the crash is an `EnvDied` ("died")
for that episode only, and closing the environment kills a hung child.

The child is started with "spawn" (forking a process that runs torch, Ray and
threads is unsafe), builds the environment from its config name and kwargs
(`python:` specs load there again), and answers reset/step/close over a pipe.
Async environments run on the child's own event loop. Only reset, step and
close cross the pipe: helpers such as `expert_action` stay in-process only.
"""

from __future__ import annotations

import asyncio
import inspect
import multiprocessing as mp
from multiprocessing.connection import Connection
from typing import Any

from cadence.envs.contract import EnvDied, ResetReturn, StepReturn


def _send_result(conn: Connection, status: str, value: Any) -> None:
    try:
        conn.send((status, value))
    except Exception as exc:  # an unpicklable result or exception: send its text instead
        conn.send(("error", RuntimeError(f"{type(value).__name__} {value!r:.200} ({exc})")))


def _serve(conn: Connection, name: str, kwargs: dict[str, Any]) -> None:
    """The child: build the env, then answer (method, argument) requests until close."""
    loop = asyncio.new_event_loop()
    try:
        from cadence.envs.registry import resolve_env_class

        env = resolve_env_class(name)(**kwargs)
    except BaseException as exc:
        _send_result(conn, "error", exc)
        return
    conn.send(("ok", None))
    while True:
        try:
            method, arg = conn.recv()
        except (EOFError, OSError):
            return  # the parent went away
        try:
            fn = getattr(env, method, None)
            result = None if fn is None else (fn() if method == "close" else fn(arg))
            if inspect.isawaitable(result):
                result = loop.run_until_complete(result)
            _send_result(conn, "ok", result)
        except BaseException as exc:
            _send_result(conn, "error", exc)
        if method == "close":
            return


class ProcessEnv:
    """Proxy to environment `name` (built with `kwargs`) living in a child process."""

    def __init__(self, name: str, kwargs: dict[str, Any] | None = None) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child_end = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve, args=(child_end, name, dict(kwargs or {})), daemon=True,
            name=f"cadence-env-{name}",
        )  # fmt: skip
        self._proc.start()
        child_end.close()  # so that the child's death reads as EOF here
        self._busy = False
        self._request(None)  # wait for the environment to be built (or its error)

    def _request(self, message: tuple[str, Any] | None) -> Any:
        self._busy = True
        try:
            if message is not None:
                self._conn.send(message)
            status, value = self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(timeout=1.0)
            raise EnvDied(f"environment process exited (exit code {self._proc.exitcode})") from None
        finally:
            self._busy = False
        if status == "error":
            raise value
        return value

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def reset(self, seed: int) -> ResetReturn:
        return self._request(("reset", seed))

    def step(self, action: str) -> StepReturn:
        return self._request(("step", action))

    def close(self) -> None:
        """Close the env in the child if it is idle; kill the child either way (e.g. mid-hang)."""
        try:
            if not self._busy and self._proc.is_alive():
                self._conn.send(("close", None))
                if self._conn.poll(2.0):
                    self._conn.recv()
        except (EOFError, OSError):
            pass
        finally:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(timeout=5.0)
            self._conn.close()
