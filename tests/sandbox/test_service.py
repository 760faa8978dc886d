"""The sandbox service over real HTTP: auth, the API, the SDK (sync and async), the CLI, errors,
several services, and the escape attacks aimed at the service itself."""

from __future__ import annotations

import asyncio
import os
import stat
import threading
import time

import httpx
import pytest
from typer.testing import CliRunner

from cadence.sandbox import Limits, SandboxError, cgroup
from cadence.sandbox.cli import app
from cadence.sandbox.client import AsyncSandbox, Sandbox
from tests.sandbox.conftest import needs_bwrap
from tests.sandbox.service import free_port, running_service

pytestmark = needs_bwrap


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with running_service(str(tmp_path_factory.mktemp("svc")), "--warm", "1", "--max-size", "8") as svc:
        yield svc


def test_every_call_needs_the_token(service):
    url, token, _ = service
    before = httpx.get(f"{url}/v1/sandboxes", headers={"Authorization": f"Bearer {token}"}).json()
    calls = [("GET", "/v1/health"), ("GET", "/v1/status"), ("GET", "/v1/sandboxes"), ("POST", "/v1/sandboxes"),
             ("GET", "/v1/events"), ("POST", "/v1/sandboxes/x/exec"), ("DELETE", "/v1/sandboxes/x"),
             ("GET", "/v1/sandboxes/x/files?path=a"), ("POST", "/v1/sandboxes/x/files"), ("GET", "/docs")]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token}, {"Authorization": f"Basic {token}"}):
        for method, path in calls:
            r = httpx.request(method, url + path, headers=headers, json={"cmd": "touch /workspace/pwned"})
            assert r.status_code == 401, (method, path, headers)
            assert "bearer token" in r.json()["detail"]
    after = httpx.get(f"{url}/v1/sandboxes", headers={"Authorization": f"Bearer {token}"}).json()
    assert [s["id"] for s in after] == [s["id"] for s in before]  # nothing was created


def test_token_file_is_private(service, tmp_path):
    from cadence.sandbox.server import write_token

    path = str(tmp_path / "sub" / "token")
    token = write_token(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and len(token) >= 40
    assert token != write_token(path)  # a fresh token every start


def test_sdk_sync_round_trip(service):
    url, token, _ = service
    with Sandbox(url, token) as sb:
        assert sb.exec("echo hi").stdout == "hi\n"
        sb.exec(code="n = 41", session=True)
        assert sb.exec(code="print(n + 1)", session=True).stdout == "42\n"
        sb.exec("cd /tmp && export N=41", session=True)
        assert sb.exec("echo $N $(pwd)", session=True).stdout == "41 /tmp\n"
        assert sb.write_file("d/x.bin", b"\x00\xff") == "/workspace/d/x.bin"
        assert sb.read_file("d/x.bin") == b"\x00\xff"
        assert sb.exec(["cat"], stdin="piped").stdout == "piped"
        info = sb.status()
        assert info.state == "busy" and info.execs == 8
        assert info.pid
        if cgroup.available():  # the sandbox's own cgroup: its CPU, memory and processes
            assert info.cpu_s > 0 and info.memory_mb > 0 and info.processes >= 2
        sid = sb.id
    events = httpx.get(f"{url}/v1/events", params={"sandbox_id": sid},
                       headers={"Authorization": f"Bearer {token}"}).json()
    assert [e["state"] for e in events][-2:] == ["stopping", "dead"]


def test_sdk_async_round_trip(service):
    url, token, _ = service

    async def main() -> list[str]:
        async def one(i: int) -> str:
            async with AsyncSandbox(url, token, limits=Limits(memory_mb=256)) as sb:
                await sb.write_file("n.txt", str(i))
                return (await sb.exec(code="print(int(open('n.txt').read()) * 2)")).stdout

        return await asyncio.gather(*(one(i) for i in range(3)))

    assert asyncio.run(main()) == ["0\n", "2\n", "4\n"]


def test_errors_are_one_line_http_errors(service):
    url, token, _ = service
    h = {"Authorization": f"Bearer {token}"}
    r = httpx.post(f"{url}/v1/sandboxes/nope/exec", json={"cmd": "true"}, headers=h)
    assert r.status_code == 404 and "no sandbox 'nope'" in r.json()["detail"]
    r = httpx.post(f"{url}/v1/sandboxes", json={"limits": {"memory_mb": 1}}, headers=h)
    assert r.status_code == 422 and "Traceback" not in r.text
    with Sandbox(url, token) as sb:
        with pytest.raises(SandboxError, match="400 FileNotFoundError"):
            sb.read_file("missing")
        with pytest.raises(SandboxError, match="exactly one of cmd or code"):
            sb.exec()
        r = httpx.post(f"{url}/v1/sandboxes/{sb.id}/exec", json={"cmd": "true", "bogus": 1}, headers=h)
        assert r.status_code == 422 and "bogus" in r.text


def test_cli_ls_events_stop(service):
    url, token, _ = service
    token_file = os.path.join(os.path.dirname(service[2].args[service[2].args.index("--token-file") + 1]), "token")
    runner = CliRunner()
    with Sandbox(url, token) as sb:
        out = runner.invoke(app, ["ls", "--url", url, "--token-file", token_file])
        assert out.exit_code == 0 and sb.id in out.stdout and "busy" in out.stdout
        out = runner.invoke(app, ["events", "--url", url, "--token-file", token_file, "--sandbox", sb.id])
        assert "acquired" in out.stdout
        out = runner.invoke(app, ["stop", sb.id, "--url", url, "--token-file", token_file])
        assert out.exit_code == 0 and f"stopped {sb.id}" in out.stdout
        with pytest.raises(SandboxError, match="404"):
            sb.exec("true")
    out = runner.invoke(app, ["ls", "--url", f"http://127.0.0.1:{free_port()}", "--token-file", token_file])
    assert out.exit_code == 2 and "is `cadence sandbox serve` running?" in out.stderr


def test_sandbox_cannot_reach_or_kill_the_service(service):
    """Escape suite, service part: the service's port and process are out of reach, and it serves
    the next call."""
    url, token, proc = service
    port = url.rsplit(":", 1)[1]
    with Sandbox(url, token) as sb:
        code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('reached')"
        assert "reached" not in sb.exec(code=code).stdout
        for attack in (f"kill -9 {proc.pid}", "kill -9 -1", f"kill -9 {os.getpid()}"):
            sb.exec(attack)
        assert sb.exec("echo still").stdout == "still\n"
    assert proc.poll() is None
    with Sandbox(url, token) as sb:
        assert sb.exec(code="print('next call')").stdout == "next call\n"


def test_several_services_share_the_load(tmp_path):
    """Given two URLs, new sandboxes go to the less loaded service; a dead one is skipped."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shared = "shared-token-for-this-test-0123456789abcdef"
    with running_service(str(tmp_path / "a"), "--warm", "0", token=shared) as (url_a, _, _), \
            running_service(str(tmp_path / "b"), "--warm", "0", token=shared) as (url_b, _, _):
        boxes = [Sandbox([url_a, url_b], shared).start() for _ in range(4)]
        try:
            assert sorted(b.url for b in boxes) == sorted([url_a, url_a, url_b, url_b])
            dead = f"http://127.0.0.1:{free_port()}"
            with Sandbox([dead, url_b], shared) as sb:
                assert sb.url == url_b and sb.exec("echo ok").stdout == "ok\n"
        finally:
            for b in boxes:
                b.close()


def test_sdk_waits_for_a_restarting_service(tmp_path):
    """A refused connection reached nothing: the SDK retries it (up to CONNECT_WAIT_S), so a call
    made while the service restarts goes through once it is back."""
    port, token, out = free_port(), "restart-token-0123456789abcdef0123", {}

    def client() -> None:
        with Sandbox(f"http://127.0.0.1:{port}", token) as sb:
            out["stdout"] = sb.exec("echo up").stdout

    thread = threading.Thread(target=client)
    thread.start()
    time.sleep(0.5)  # the client is already being refused
    with running_service(str(tmp_path), "--warm", "0", port=port, token=token):
        thread.join(timeout=60)
    assert out.get("stdout") == "up\n"
