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
"""

from __future__ import annotations

import asyncio
import base64
import os
import time

import httpx

from cadence.sandbox.models import ExecRequest, ExecResult, Limits, SandboxDied, SandboxError
from cadence.sandbox.pool import SandboxInfo

DEFAULT_URL = "http://127.0.0.1:8765"
DEFAULT_TOKEN_FILE = os.path.join(os.path.expanduser("~"), ".cadence", "sandbox", "token")
RETRIES = 3
CONNECT_WAIT_S = 10.0  # a refused connection to a service once reached is retried this long: a restart


def resolve(url: str | list[str] | None, token: str | None) -> tuple[list[str], str]:
    urls = url if isinstance(url, list) else [url or os.environ.get("CADENCE_SANDBOX_URL", DEFAULT_URL)]
    if token is None:
        token = os.environ.get("CADENCE_SANDBOX_TOKEN")
    if token is None:
        path = os.environ.get("CADENCE_SANDBOX_TOKEN_FILE", DEFAULT_TOKEN_FILE)
        try:
            with open(path) as f:
                token = f.read().strip()
        except OSError as e:
            raise SandboxError(f"no token: pass token=, set CADENCE_SANDBOX_TOKEN, or start the service "
                               f"(it writes {path})") from e
    return [u.rstrip("/") for u in urls], token


class ServiceBusy(SandboxError):
    """The service's pool is full (HTTP 429)."""


class ServiceUnreachable(SandboxError):
    """Nothing answers at the service's URL."""


REACHED: set[str] = set()  # services (scheme://host:port) that answered a client of this process


def service_of(url: str) -> str:
    where = httpx.URL(url)
    return f"{where.scheme}://{where.netloc.decode()}"


def connect_wait(url: str, first_contact_s: float) -> float:
    """How long a refused connection to `url` is retried: CONNECT_WAIT_S for a service that
    answered before (a restart), `first_contact_s` for one never reached (maybe not running)."""
    return CONNECT_WAIT_S if service_of(url) in REACHED else first_contact_s


def unreachable(url: str, exc: Exception) -> ServiceUnreachable:
    return ServiceUnreachable(f"cannot reach the sandbox service at {service_of(url)} "
                              f"({type(exc).__name__}); is `cadence sandbox serve` running?")


def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        detail = resp.json().get("detail", resp.text)
    except ValueError:
        detail = resp.text
    if not isinstance(detail, str):  # pydantic validation errors: name the field
        detail = "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" for d in detail)
    msg = f"{resp.request.method} {resp.request.url.path}: {resp.status_code} {detail}"
    if resp.status_code == 503:
        raise SandboxDied(msg)
    raise ServiceBusy(msg) if resp.status_code == 429 else SandboxError(msg)


SAFE = {"GET", "DELETE"}
RETRY_STATUS = {502, 503, 504}


def _exec_body(cmd, code, stdin, session, timeout_s, env, judge) -> dict:
    return ExecRequest(cmd=cmd, code=code, stdin=stdin, session=session, timeout_s=timeout_s,
                       env=env or {}, judge=judge).model_dump()


class Sandbox:
    """A sandbox on a service, created on enter (or `start()`), stopped on exit (or `stop()`)."""

    def __init__(self, url: str | list[str] | None = None, token: str | None = None,
                 limits: Limits | None = None, timeout_s: float = 600.0, connect_wait_s: float = 0.0,
                 template: str | None = None) -> None:
        """`connect_wait_s`: how long to wait for a service not reached yet (one starting beside
        this client); 0 fails at once with a one-line ServiceUnreachable."""
        self.urls, token = resolve(url, token)
        self.limits = limits
        self.template = template  # a template's name on the service (its root file system)
        self.connect_wait_s = connect_wait_s
        self.http = httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s)
        self.url: str | None = None
        self.id: str | None = None

    def _req(self, method: str, url: str, connect_wait_s: float | None = None, **kw) -> httpx.Response:
        if connect_wait_s is None:
            connect_wait_s = connect_wait(url, self.connect_wait_s)
        deadline, attempt = time.monotonic() + connect_wait_s, 0
        while True:
            try:
                resp = self.http.request(method, url, **kw)
                REACHED.add(service_of(url))
            except httpx.ConnectError as e:  # nothing reached the service: always safe to retry
                if time.monotonic() >= deadline:
                    raise unreachable(url, e) from None
            except httpx.TransportError:
                if method not in SAFE or attempt >= RETRIES:
                    raise
            else:
                if not (method in SAFE and resp.status_code in RETRY_STATUS) or attempt >= RETRIES:
                    _raise_for(resp)
                    return resp
            time.sleep(min(0.05 * 2 ** attempt, 1.0))
            attempt += 1

    def _pick(self) -> list[str]:
        if len(self.urls) == 1:
            return self.urls
        load = {}
        for u in self.urls:
            try:
                load[u] = sum(self._req("GET", f"{u}/v1/health", connect_wait_s=0).json()["counts"].values())
            except (httpx.HTTPError, SandboxError):
                continue
        return sorted(load, key=load.get) or self.urls

    def start(self) -> Sandbox:
        body = {"limits": self.limits.model_dump()} if self.limits else {}
        if self.template:
            body["template"] = self.template
        err: Exception | None = None
        for u in self._pick():
            try:
                wait = connect_wait(u, self.connect_wait_s) if len(self.urls) == 1 else 0.0  # else the next one
                info = SandboxInfo(**self._req("POST", f"{u}/v1/sandboxes", wait, json=body).json())
            except (ServiceUnreachable, ServiceBusy) as e:  # down, or full: try the next service
                err = e
                continue
            self.url, self.id = u, info.id
            return self
        if len(self.urls) == 1:
            raise err
        raise SandboxError(f"no sandbox service could create a sandbox ({err})")

    @property
    def _base(self) -> str:
        if self.id is None:
            raise SandboxError("sandbox not started: use `with Sandbox(...)` or call start()")
        return f"{self.url}/v1/sandboxes/{self.id}"

    def exec(self, cmd: str | list[str] | None = None, *, code: str | None = None, stdin: str = "",
             session: bool = False, timeout_s: float | None = None, env: dict | None = None,
             judge: bool = False) -> ExecResult:
        body = _exec_body(cmd, code, stdin, session, timeout_s, env, judge)
        return ExecResult(**self._req("POST", f"{self._base}/exec", json=body).json())

    def write_file(self, path: str, data: bytes | str, mode: int | None = None) -> str:
        raw = data.encode() if isinstance(data, str) else data
        body = {"path": path, "content": base64.b64encode(raw).decode(), "encoding": "base64", "mode": mode}
        return self._req("POST", f"{self._base}/files", json=body).json()["path"]

    def read_file(self, path: str) -> bytes:
        return base64.b64decode(self._req("GET", f"{self._base}/files", params={"path": path}).json()["content"])

    def status(self) -> SandboxInfo:
        return SandboxInfo(**self._req("GET", self._base).json())

    def stop(self) -> None:
        if self.id is not None:
            try:
                self._req("DELETE", self._base)
            except SandboxError as e:
                if "404" not in str(e):
                    raise
            self.id = None

    def close(self) -> None:
        try:
            self.stop()
        finally:
            self.http.close()

    def __enter__(self) -> Sandbox:
        return self.start() if self.id is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncSandbox:
    """`Sandbox` for asyncio: the same calls, awaited."""

    def __init__(self, url: str | list[str] | None = None, token: str | None = None,
                 limits: Limits | None = None, timeout_s: float = 600.0, connect_wait_s: float = 0.0,
                 template: str | None = None) -> None:
        self.urls, token = resolve(url, token)
        self.limits = limits
        self.template = template  # a template's name on the service (its root file system)
        self.connect_wait_s = connect_wait_s
        self.http = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s)
        self.url: str | None = None
        self.id: str | None = None

    async def _req(self, method: str, url: str, connect_wait_s: float | None = None, **kw) -> httpx.Response:
        if connect_wait_s is None:
            connect_wait_s = connect_wait(url, self.connect_wait_s)
        deadline, attempt = time.monotonic() + connect_wait_s, 0
        while True:
            try:
                resp = await self.http.request(method, url, **kw)
                REACHED.add(service_of(url))
            except httpx.ConnectError as e:
                if time.monotonic() >= deadline:
                    raise unreachable(url, e) from None
            except httpx.TransportError:
                if method not in SAFE or attempt >= RETRIES:
                    raise
            else:
                if not (method in SAFE and resp.status_code in RETRY_STATUS) or attempt >= RETRIES:
                    _raise_for(resp)
                    return resp
            await asyncio.sleep(min(0.05 * 2 ** attempt, 1.0))
            attempt += 1

    async def _pick(self) -> list[str]:
        if len(self.urls) == 1:
            return self.urls
        load = {}
        for u in self.urls:
            try:
                load[u] = sum((await self._req("GET", f"{u}/v1/health", connect_wait_s=0)).json()["counts"].values())
            except (httpx.HTTPError, SandboxError):
                continue
        return sorted(load, key=load.get) or self.urls

    async def start(self) -> AsyncSandbox:
        body = {"limits": self.limits.model_dump()} if self.limits else {}
        if self.template:
            body["template"] = self.template
        err: Exception | None = None
        for u in await self._pick():
            try:
                wait = connect_wait(u, self.connect_wait_s) if len(self.urls) == 1 else 0.0
                info = SandboxInfo(**(await self._req("POST", f"{u}/v1/sandboxes", wait, json=body)).json())
            except (ServiceUnreachable, ServiceBusy) as e:
                err = e
                continue
            self.url, self.id = u, info.id
            return self
        if len(self.urls) == 1:
            raise err
        raise SandboxError(f"no sandbox service could create a sandbox ({err})")

    @property
    def _base(self) -> str:
        if self.id is None:
            raise SandboxError("sandbox not started: use `async with AsyncSandbox(...)` or await start()")
        return f"{self.url}/v1/sandboxes/{self.id}"

    async def exec(self, cmd: str | list[str] | None = None, *, code: str | None = None, stdin: str = "",
                   session: bool = False, timeout_s: float | None = None, env: dict | None = None,
             judge: bool = False) -> ExecResult:
        body = _exec_body(cmd, code, stdin, session, timeout_s, env, judge)
        return ExecResult(**(await self._req("POST", f"{self._base}/exec", json=body)).json())

    async def write_file(self, path: str, data: bytes | str, mode: int | None = None) -> str:
        raw = data.encode() if isinstance(data, str) else data
        body = {"path": path, "content": base64.b64encode(raw).decode(), "encoding": "base64", "mode": mode}
        return (await self._req("POST", f"{self._base}/files", json=body)).json()["path"]

    async def read_file(self, path: str) -> bytes:
        resp = await self._req("GET", f"{self._base}/files", params={"path": path})
        return base64.b64decode(resp.json()["content"])

    async def status(self) -> SandboxInfo:
        return SandboxInfo(**(await self._req("GET", self._base)).json())

    async def stop(self) -> None:
        if self.id is not None:
            try:
                await self._req("DELETE", self._base)
            except SandboxError as e:
                if "404" not in str(e):
                    raise
            self.id = None

    async def close(self) -> None:
        try:
            await self.stop()
        finally:
            await self.http.aclose()

    async def __aenter__(self) -> AsyncSandbox:
        return await self.start() if self.id is None else self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
