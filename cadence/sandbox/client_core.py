"""What the sync and async sandbox clients (client.py) share: the requests, the retry rule, the
errors and the parsing, written once.

Each call is a generator of `Send` steps: it yields the request it needs sent and gets the
response back at the yield (or, thrown in there, what sending it raised), so it reads like plain
blocking code. A client does only the I/O: `Sandbox` sends and sleeps blocking, `AsyncSandbox`
awaits; `Exchange` carries the replies between the client and the call.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import httpx

from cadence.sandbox.models import ExecRequest, ExecResult, Limits, SandboxDied, SandboxError
from cadence.sandbox.pool import SandboxInfo

DEFAULT_URL = "http://127.0.0.1:8765"
DEFAULT_TOKEN_FILE = os.path.join(os.path.expanduser("~"), ".cadence", "sandbox", "token")
RETRIES = 3
CONNECT_WAIT_S = 10.0  # a refused connection to a service once reached is retried this long: a restart
SAFE = {"GET", "DELETE"}
RETRY_STATUS = {502, 503, 504}


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


def raise_for(resp: httpx.Response) -> None:
    """A one-line SandboxError for an HTTP error (SandboxDied for 503, ServiceBusy for 429)."""
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


@dataclass(frozen=True)
class Send:
    """One HTTP request for the client to send, after waiting `after_s` (a retry's back-off)."""

    method: str
    url: str
    kw: dict = field(default_factory=dict)  # httpx's request arguments: json=, params=
    after_s: float = 0.0


T = TypeVar("T")
Steps = Generator[Send, httpx.Response, T]  # a call: yields requests, gets their responses, returns T


class Exchange(Generic[T]):
    """Runs a call's steps for a client: iterate it for the requests to send, and set `reply`
    (the response) or `error` (what sending raised) before taking the next; then `value`."""

    def __init__(self, steps: Steps[T]) -> None:
        self.steps = steps
        self.reply: httpx.Response | None = None
        self.error: Exception | None = None
        self.value: T | None = None

    def __iter__(self) -> Iterator[Send]:
        while True:
            reply, error, self.reply, self.error = self.reply, self.error, None, None
            try:
                step = self.steps.send(reply) if error is None else self.steps.throw(error)  # type: ignore[arg-type]
            except StopIteration as done:
                self.value = done.value
                return
            yield step


class SandboxCalls:
    """A sandbox on a service and its calls as steps; `Sandbox` and `AsyncSandbox` (client.py)
    do the I/O. `http_client` is the httpx client class of a client, `start_hint` how it starts."""

    http_client: ClassVar[type[httpx.Client] | type[httpx.AsyncClient]]
    start_hint: ClassVar[str]

    def __init__(self, url: str | list[str] | None = None, token: str | None = None,
                 limits: Limits | None = None, timeout_s: float = 600.0, connect_wait_s: float = 0.0,
                 template: str | None = None) -> None:
        """`connect_wait_s`: how long to wait for a service not reached yet (one starting beside
        this client); 0 fails at once with a one-line ServiceUnreachable."""
        self.urls, token = resolve(url, token)
        self.limits = limits
        self.template = template  # a template's name on the service (its root file system)
        self.connect_wait_s = connect_wait_s
        self.http: Any = self.http_client(headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s)
        self.url: str | None = None
        self.id: str | None = None

    def _request(self, method: str, url: str, connect_wait_s: float | None = None, **kw: Any) -> Steps[httpx.Response]:
        """Retried: a request that never reached the service (for `connect_wait_s`), and a safe
        one on 502/503/504 or a dropped connection (RETRIES times); never an exec or a write
        that may have run."""
        if connect_wait_s is None:
            connect_wait_s = connect_wait(url, self.connect_wait_s)
        deadline, attempt = time.monotonic() + connect_wait_s, 0
        while True:
            try:
                resp = yield Send(method, url, kw, min(0.05 * 2 ** (attempt - 1), 1.0) if attempt else 0.0)
                REACHED.add(service_of(url))
            except httpx.ConnectError as e:  # nothing reached the service: always safe to retry
                if time.monotonic() >= deadline:
                    raise unreachable(url, e) from None
            except httpx.TransportError:
                if method not in SAFE or attempt >= RETRIES:
                    raise
            else:
                if not (method in SAFE and resp.status_code in RETRY_STATUS) or attempt >= RETRIES:
                    raise_for(resp)
                    return resp
            attempt += 1

    def _pick(self) -> Steps[list[str]]:
        """The services to try, the least loaded first (their /v1/health); those that answer."""
        if len(self.urls) == 1:
            return self.urls
        load = {}
        for u in self.urls:
            try:
                resp = yield from self._request("GET", f"{u}/v1/health", connect_wait_s=0)
                load[u] = sum(resp.json()["counts"].values())
            except (httpx.HTTPError, SandboxError):
                continue
        return sorted(load, key=load.get) or self.urls

    def _start(self) -> Steps[None]:
        body: dict[str, Any] = {"limits": self.limits.model_dump()} if self.limits else {}
        if self.template:
            body["template"] = self.template
        err: Exception | None = None
        for u in (yield from self._pick()):
            try:
                wait = connect_wait(u, self.connect_wait_s) if len(self.urls) == 1 else 0.0  # else the next one
                info = SandboxInfo(**(yield from self._request("POST", f"{u}/v1/sandboxes", wait, json=body)).json())
            except (ServiceUnreachable, ServiceBusy) as e:  # down, or full: try the next service
                err = e
                continue
            self.url, self.id = u, info.id
            return
        if len(self.urls) == 1:
            raise err
        raise SandboxError(f"no sandbox service could create a sandbox ({err})")

    @property
    def _base(self) -> str:
        if self.id is None:
            raise SandboxError(f"sandbox not started: {self.start_hint}")
        return f"{self.url}/v1/sandboxes/{self.id}"

    def _exec(self, request: ExecRequest) -> Steps[ExecResult]:
        resp = yield from self._request("POST", f"{self._base}/exec", json=request.model_dump())
        return ExecResult(**resp.json())

    def _write_file(self, path: str, data: bytes | str, mode: int | None) -> Steps[str]:
        raw = data.encode() if isinstance(data, str) else data
        body = {"path": path, "content": base64.b64encode(raw).decode(), "encoding": "base64", "mode": mode}
        return (yield from self._request("POST", f"{self._base}/files", json=body)).json()["path"]

    def _read_file(self, path: str) -> Steps[bytes]:
        resp = yield from self._request("GET", f"{self._base}/files", params={"path": path})
        return base64.b64decode(resp.json()["content"])

    def _status(self) -> Steps[SandboxInfo]:
        return SandboxInfo(**(yield from self._request("GET", self._base)).json())

    def _stop(self) -> Steps[None]:
        if self.id is not None:
            try:
                yield from self._request("DELETE", self._base)
            except SandboxError as e:
                if "404" not in str(e):
                    raise
            self.id = None
