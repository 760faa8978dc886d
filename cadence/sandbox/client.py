"""Python SDK for the sandbox service (sync `Sandbox`, async `AsyncSandbox`, on httpx).

    with Sandbox(url="http://127.0.0.1:8765") as sb:      # token: ~/.cadence/sandbox/token
        sb.exec(code="x = 1", session=True)
        print(sb.exec(code="print(x + 1)", session=True).stdout)

Given several service URLs, a new sandbox goes to the one with the fewest live sandboxes (its
/v1/health), skipping services that do not answer. A service this process never reached fails
at once with one line (`ServiceUnreachable`: is `cadence sandbox serve` running?), unless
`connect_wait_s=` asks to wait for one still starting. Once reached (by any client of this
process), retried: anything whose request never reached the service (connection refused: for up
to CONNECT_WAIT_S, so a restarting service is waited for), and idempotent reads and stops on
502/503/504 or a dropped connection. Not retried: an exec or write that may have run (its sandbox's state is unknown).

The calls themselves (requests, retries, errors, parsing) are written once, in client_core.py;
the two classes here only send, sleep and await.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from cadence.sandbox.client_core import (
    Exchange,
    SandboxCalls,
    ServiceBusy,
    ServiceUnreachable,
    Steps,
    T,
    resolve,
)
from cadence.sandbox.models import ExecRequest, ExecResult
from cadence.sandbox.pool import SandboxInfo

__all__ = ["AsyncSandbox", "Sandbox", "ServiceBusy", "ServiceUnreachable", "resolve"]


class Sandbox(SandboxCalls):
    """A sandbox on a service, created on enter (or `start()`), stopped on exit (or `stop()`)."""

    http_client = httpx.Client
    start_hint = "use `with Sandbox(...)` or call start()"

    def _run(self, steps: Steps[T]) -> T:
        exchange = Exchange(steps)
        for send in exchange:
            if send.after_s:
                time.sleep(send.after_s)
            try:
                exchange.reply = self.http.request(send.method, send.url, **send.kw)
            except Exception as e:  # the call sees it where it sent the request
                exchange.error = e
        return exchange.value

    def _req(self, method: str, url: str, **kw: Any) -> httpx.Response:
        """One request under client_core's retry rule (for a subclass's own routes: HostedEnv)."""
        return self._run(self._request(method, url, **kw))

    def start(self) -> Sandbox:
        self._run(self._start())
        return self

    def exec(self, cmd: str | list[str] | None = None, *, code: str | None = None, stdin: str = "",
             session: bool = False, timeout_s: float | None = None, env: dict | None = None,
             judge: bool = False) -> ExecResult:
        return self._run(self._exec(ExecRequest(cmd=cmd, code=code, stdin=stdin, session=session,
                                                timeout_s=timeout_s, env=env or {}, judge=judge)))

    def write_file(self, path: str, data: bytes | str, mode: int | None = None) -> str:
        return self._run(self._write_file(path, data, mode))

    def read_file(self, path: str) -> bytes:
        return self._run(self._read_file(path))

    def status(self) -> SandboxInfo:
        return self._run(self._status())

    def stop(self) -> None:
        self._run(self._stop())

    def close(self) -> None:
        try:
            self.stop()
        finally:
            self.http.close()

    def __enter__(self) -> Sandbox:
        return self.start() if self.id is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncSandbox(SandboxCalls):
    """`Sandbox` for asyncio: the same calls, awaited."""

    http_client = httpx.AsyncClient
    start_hint = "use `async with AsyncSandbox(...)` or await start()"

    async def _run(self, steps: Steps[T]) -> T:
        exchange = Exchange(steps)
        for send in exchange:
            if send.after_s:
                await asyncio.sleep(send.after_s)
            try:
                exchange.reply = await self.http.request(send.method, send.url, **send.kw)
            except Exception as e:
                exchange.error = e
        return exchange.value

    async def start(self) -> AsyncSandbox:
        await self._run(self._start())
        return self

    async def exec(self, cmd: str | list[str] | None = None, *, code: str | None = None, stdin: str = "",
                   session: bool = False, timeout_s: float | None = None, env: dict | None = None,
                   judge: bool = False) -> ExecResult:
        return await self._run(self._exec(ExecRequest(cmd=cmd, code=code, stdin=stdin, session=session,
                                                      timeout_s=timeout_s, env=env or {}, judge=judge)))

    async def write_file(self, path: str, data: bytes | str, mode: int | None = None) -> str:
        return await self._run(self._write_file(path, data, mode))

    async def read_file(self, path: str) -> bytes:
        return await self._run(self._read_file(path))

    async def status(self) -> SandboxInfo:
        return await self._run(self._status())

    async def stop(self) -> None:
        await self._run(self._stop())

    async def close(self) -> None:
        try:
            await self.stop()
        finally:
            await self.http.aclose()

    async def __aenter__(self) -> AsyncSandbox:
        return await self.start() if self.id is None else self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
