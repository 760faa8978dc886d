"""The sync and async SDK clients against one scripted service (httpx's MockTransport): the same
requests, retries and errors from both, since both run client_core's calls."""

from __future__ import annotations

import asyncio
import base64
import itertools

import httpx
import pytest

from cadence.sandbox import SandboxDied, SandboxError
from cadence.sandbox.client import AsyncSandbox, Sandbox, ServiceUnreachable

HOSTS = itertools.count()  # a fresh host per client: "reached" is remembered per process


def info(sid: str) -> dict:
    return {"id": sid, "state": "busy", "generation": 0, "created_at": 0.0, "last_used": 0.0, "execs": 0,
            "replacements": 0, "last_reason": "", "limits": {}, "isolated": True}


class Service:
    """Answers each (method, path) with the next of its scripted replies; logs every request."""

    def __init__(self, script: dict[tuple[str, str], list]) -> None:
        self.script, self.log = script, []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.log.append(f"{request.url.host} {request.method} {request.url.path}")
        reply = self.script[request.method, request.url.path].pop(0)
        if isinstance(reply, Exception):
            raise reply
        status, body = reply
        return httpx.Response(status, json=body)


def client(kind: str, urls: list[str], service: Service):
    sb = (Sandbox if kind == "sync" else AsyncSandbox)(urls, "token")
    transport = httpx.MockTransport(service)
    sb.http = httpx.Client(transport=transport) if kind == "sync" else httpx.AsyncClient(transport=transport)
    return sb


@pytest.fixture(params=["sync", "async"])
def kind(request):
    return request.param


@pytest.fixture
def call(kind):
    """Calls a client's method and returns its result, awaited on one loop for the async one."""
    loop = asyncio.new_event_loop()

    def run(method, *args, **kw):
        result = method(*args, **kw)
        return loop.run_until_complete(result) if kind == "async" else result
    yield run
    loop.close()


def test_safe_calls_are_retried_and_the_rest_fail_at_once(kind, call):
    host = f"s{next(HOSTS)}.test"
    box = "/v1/sandboxes/b1"
    lost = httpx.ReadError("connection dropped")
    service = Service({
        ("POST", "/v1/sandboxes"): [(200, info("b1"))],
        ("GET", box): [(503, {"detail": "restarting"}), (502, {}), (200, info("b1"))],
        ("POST", f"{box}/exec"): [(503, {"detail": "sandbox died"})],
        ("GET", f"{box}/files"): [lost, (200, {"content": base64.b64encode(b"hi").decode()})],
        ("POST", f"{box}/files"): [lost],
        ("DELETE", box): [(404, {"detail": "no sandbox 'b1'"})],
    })
    sb = client(kind, [f"http://{host}"], service)
    call(sb.start)
    assert call(sb.status).id == "b1"  # 503, 502, then 200: a read is retried
    with pytest.raises(SandboxDied, match="POST /v1/sandboxes/b1/exec: 503 sandbox died"):
        call(sb.exec, "true")  # an exec may have run: never retried
    assert call(sb.read_file, "x") == b"hi"  # a dropped connection: a read is retried
    with pytest.raises(httpx.ReadError):
        call(sb.write_file, "x", "hi")  # a write may have landed: never retried
    call(sb.stop)  # already gone (404): stopped
    assert sb.id is None
    with pytest.raises(SandboxError, match="sandbox not started"):
        call(sb.status)
    assert [line.split(" ", 1)[1] for line in service.log] == [
        "POST /v1/sandboxes", "GET /v1/sandboxes/b1", "GET /v1/sandboxes/b1", "GET /v1/sandboxes/b1",
        "POST /v1/sandboxes/b1/exec", "GET /v1/sandboxes/b1/files", "GET /v1/sandboxes/b1/files",
        "POST /v1/sandboxes/b1/files", "DELETE /v1/sandboxes/b1"]


def test_a_new_sandbox_goes_to_the_least_loaded_service_that_answers(kind, call):
    busy, idle, dead = (f"s{next(HOSTS)}.test" for _ in range(3))
    service = Service({
        ("GET", "/v1/health"): [(200, {"counts": {"busy": 3}}), httpx.ConnectError("refused"),
                                (200, {"counts": {"busy": 1}})],  # asked in order: busy, dead, idle
        ("POST", "/v1/sandboxes"): [(429, {"detail": "pool full"}), (200, info("b2"))],
    })
    sb = client(kind, [f"http://{busy}", f"http://{dead}", f"http://{idle}"], service)
    call(sb.start)
    assert (sb.url, sb.id) == (f"http://{busy}", "b2")  # the idle one was full (429): the next one
    assert service.log == [f"{busy} GET /v1/health", f"{dead} GET /v1/health", f"{idle} GET /v1/health",
                           f"{idle} POST /v1/sandboxes", f"{busy} POST /v1/sandboxes"]


def test_a_service_never_reached_fails_at_once_in_one_line(kind, call):
    host = f"s{next(HOSTS)}.test"
    service = Service({("POST", "/v1/sandboxes"): [httpx.ConnectError("refused")]})
    sb = client(kind, [f"http://{host}"], service)
    with pytest.raises(ServiceUnreachable) as raised:
        call(sb.start)
    assert str(raised.value) == (f"cannot reach the sandbox service at http://{host} (ConnectError); "
                                 "is `cadence sandbox serve` running?")
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    assert len(service.log) == 1
