"""The sandbox service over real HTTP: auth, the API, the SDK (sync and async), the CLI, errors,
several services, and the escape attacks aimed at the service itself."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import threading
import time

import httpx
import pytest
from typer.testing import CliRunner

from cadence.sandbox import Limits, SandboxError, cgroup
from cadence.sandbox.auth import UnsafeTokenPath
from cadence.sandbox.cli import app
from cadence.sandbox.client import AsyncSandbox, Sandbox, ServiceUnreachable
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


def test_token_file_is_never_written_where_others_can_plant_one(tmp_path):
    """Issue 26 finding 5: in a folder another user could write, --token-file kept a pre-created
    file's owner and followed a planted symlink (writing the token wherever it pointed)."""
    from cadence.sandbox.server import write_token

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UnsafeTokenPath, match="can be written by other users"):
        write_token(str(shared / "token"))
    assert not (shared / "token").exists()
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    target = tmp_path / "elsewhere"
    target.write_text("theirs\n")
    (private / "token").symlink_to(target)
    with pytest.raises(UnsafeTokenPath, match="a link"):
        write_token(str(private / "token"))
    assert target.read_text() == "theirs\n"  # not followed
    (private / "token").unlink()
    (private / "token").write_text("planted\n")
    os.chown(private / "token", 12345, 12345)
    with pytest.raises(UnsafeTokenPath, match="owned by uid 12345"):
        write_token(str(private / "token"))
    (private / "token").unlink()
    token = write_token(str(private / "token"))  # a private folder and no file: written, 0600
    st = os.lstat(private / "token")
    assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600
    assert (private / "token").read_text() == token + "\n"


def test_serve_refuses_an_unsafe_token_file_in_one_line(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    r = subprocess.run([sys.executable, "-m", "cadence.sandbox.server", "--token-file", str(shared / "token"),
                        "--port", str(free_port())], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("cadence sandbox serve: --token-file")


def test_numeric_fields_are_finite_and_bounded(service):
    """Issue 26 finding 4: timeout_s 1e308 or Infinity passed validation, ran the command, and the
    host's deadline arithmetic raised OverflowError (500). Now a 422 naming the field."""
    url, token, _ = service
    h = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    with Sandbox(url, token) as sb:
        exec_url = f"{url}/v1/sandboxes/{sb.id}/exec"
        for raw, says in [('{"cmd": "true", "timeout_s": 1e308}', "less than or equal to 86400"),
                          ('{"cmd": "true", "timeout_s": Infinity}', "finite number"),
                          ('{"cmd": "true", "timeout_s": NaN}', "finite number"),
                          ('{"cmd": "true", "timeout_s": -Infinity}', "finite number")]:
            r = httpx.post(exec_url, content=raw, headers=h)
            assert r.status_code == 422, (raw, r.text)
            assert r.json()["detail"].startswith("body.timeout_s: ") and says in r.json()["detail"], r.text
        assert sb.exec("echo still fine").stdout == "still fine\n"
    for limits in ({"cpu_s": 1e308}, {"wall_s": "Infinity"}, {"memory_mb": 10**30}, {"cpus": 1e9}):
        r = httpx.post(f"{url}/v1/sandboxes", json={"limits": limits}, headers=h)
        assert r.status_code == 422 and f"body.limits.{next(iter(limits))}" in r.json()["detail"], r.text
    r = httpx.post(f"{url}/v1/envs", json={"name": "frozenlake", "step_timeout_s": 1e308}, headers=h)
    assert r.status_code == 422 and "step_timeout_s" in r.json()["detail"]
    r = httpx.get(f"{url}/v1/events", params={"limit": 10**30}, headers=h)
    assert r.status_code == 422 and "query.limit" in r.json()["detail"]


def test_request_bodies_over_the_limit_get_413(service):
    """Issue 26 finding 5: no request-size limit (a 24 MiB body cost +96 MiB of service memory)."""
    url, token, _ = service
    h = {"Authorization": f"Bearer {token}"}
    with Sandbox(url, token) as sb:
        big = {"cmd": "wc -c", "stdin": "x" * (24 << 20)}
        r = httpx.post(f"{url}/v1/sandboxes/{sb.id}/exec", json=big, headers=h, timeout=60)
        assert r.status_code == 413 and "--max-body-mb" in r.json()["detail"]

        def chunks():  # no Content-Length: refused once the chunks pass the limit
            for _ in range(24):
                yield b"x" * (1 << 20)

        r = httpx.post(f"{url}/v1/sandboxes/{sb.id}/files", content=chunks(), headers=h, timeout=60)
        assert r.status_code == 413
        assert sb.exec("wc -c", stdin="x" * (1 << 20)).stdout.strip() == str(1 << 20)  # under it: fine
        assert sb.write_file("f", b"y" * (4 << 20)) and len(sb.read_file("f")) == 4 << 20


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


def admin_issues(url: str, token: str, name: str) -> str:
    r = httpx.post(f"{url}/v1/clients", json={"name": name}, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return r.json()["token"]


def test_each_client_token_sees_and_acts_on_its_own_sandboxes_only(service):
    """Issue 26 finding 5: one shared token let any client list, read and delete every other
    client's sandboxes. A client token now sees its own; the admin token sees all."""
    url, admin, _ = service
    alice, bob = admin_issues(url, admin, "alice"), admin_issues(url, admin, "bob")
    hb = {"Authorization": f"Bearer {bob}"}
    with Sandbox(url, alice) as mine:
        mine.write_file("secret.txt", "alice's")
        base = f"{url}/v1/sandboxes/{mine.id}"
        assert mine.id not in [s["id"] for s in httpx.get(f"{url}/v1/sandboxes", headers=hb).json()]
        assert mine.id not in [s["id"] for s in httpx.get(f"{url}/v1/status", headers=hb).json()["sandboxes"]]
        for method, path, kw in [("GET", "", {}), ("POST", "/exec", {"json": {"cmd": "cat secret.txt"}}),
                                 ("GET", "/files", {"params": {"path": "secret.txt"}}),
                                 ("POST", "/files", {"json": {"path": "x", "content": "y"}}), ("DELETE", "", {})]:
            r = httpx.request(method, base + path, headers=hb, **kw)
            assert r.status_code == 404 and "no sandbox" in r.json()["detail"], (method, path, r.text)
        r = httpx.get(f"{url}/v1/events", params={"sandbox_id": mine.id}, headers=hb)
        assert r.status_code == 404
        assert httpx.get(f"{url}/v1/events", headers=hb).status_code == 400  # the whole log is the admin's
        r = httpx.post(f"{url}/v1/clients", json={"name": "mallory"}, headers=hb)
        assert r.status_code == 403 and "admin token" in r.json()["detail"]
        assert mine.read_file("secret.txt") == b"alice's"  # untouched, and alice still has it
        assert [s["id"] for s in httpx.get(f"{url}/v1/sandboxes", headers={"Authorization": f"Bearer {alice}"}).json()] == [mine.id]
        listed = httpx.get(f"{url}/v1/sandboxes", headers={"Authorization": f"Bearer {admin}"}).json()
        assert {"id": mine.id, "owner": "alice"}.items() <= next(s for s in listed if s["id"] == mine.id).items()
        assert sorted(httpx.get(f"{url}/v1/clients", headers={"Authorization": f"Bearer {admin}"}).json()) >= ["alice", "bob"]
        r = httpx.delete(f"{url}/v1/clients/alice", headers={"Authorization": f"Bearer {admin}"})
        assert r.status_code == 200
        r = httpx.get(base, headers={"Authorization": f"Bearer {alice}"})
        assert r.status_code == 401  # revoked: the token is gone, and its sandboxes with it
        assert httpx.get(base, headers={"Authorization": f"Bearer {admin}"}).status_code == 404
        mine.id = None


def test_issued_client_tokens_survive_a_restart_in_the_clients_file(tmp_path):
    clients_file = tmp_path / "clients"
    admin = "admin-token-for-this-test-0123456789abcdef"
    with running_service(str(tmp_path), "--warm", "0", "--clients-file", str(clients_file), token=admin) as (url, _, _):
        carol = admin_issues(url, admin, "carol")
    assert stat.S_IMODE(os.stat(clients_file).st_mode) == 0o600 and f"carol {carol}" in clients_file.read_text()
    with running_service(str(tmp_path), "--warm", "0", "--clients-file", str(clients_file), token=admin) as (url, _, _):
        with Sandbox(url, carol) as sb:
            assert sb.status().owner == "carol"


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


def test_cli_issues_lists_and_revokes_client_tokens(service):
    url, admin, proc = service
    token_file = proc.args[proc.args.index("--token-file") + 1]
    runner = CliRunner()
    out = runner.invoke(app, ["client", "add", "dave", "--url", url, "--token-file", token_file])
    assert out.exit_code == 0, out.output
    dave = out.stdout.strip()
    with Sandbox(url, dave) as sb:
        out = runner.invoke(app, ["ls", "--url", url, "--token-file", token_file])
        assert f"{sb.id}  busy" in out.stdout and "owner=dave" in out.stdout
        assert "dave" in runner.invoke(app, ["client", "ls", "--url", url, "--token-file", token_file]).stdout
        out = runner.invoke(app, ["client", "rm", "dave", "--url", url, "--token-file", token_file])
        assert out.exit_code == 0 and "revoked dave" in out.stdout
        sb.id = None  # stopped with its token
    assert "dave" not in runner.invoke(app, ["client", "ls", "--url", url, "--token-file", token_file]).stdout


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
    """A refused connection reached nothing: with connect_wait_s the SDK retries it, so a call
    made while the service (re)starts goes through once it is up."""
    port, token, out = free_port(), "restart-token-0123456789abcdef0123", {}

    def client() -> None:
        with Sandbox(f"http://127.0.0.1:{port}", token, connect_wait_s=60) as sb:
            out["stdout"] = sb.exec("echo up").stdout

    thread = threading.Thread(target=client)
    thread.start()
    time.sleep(0.5)  # the client is already being refused
    with running_service(str(tmp_path), "--warm", "0", port=port, token=token):
        thread.join(timeout=60)
    assert out.get("stdout") == "up\n"


def test_sdk_without_a_service_fails_at_once_with_the_cli_hint(monkeypatch):
    """Issue 28 item 11: the SDK without a running service retried for 10.8 s and ended in an
    httpx traceback. It now tries once and says, in one line, what the CLI says."""
    attempts = []
    real = httpx.Client.request

    def counting(self, method, url, **kw):
        attempts.append(url)
        return real(self, method, url, **kw)

    monkeypatch.setattr(httpx.Client, "request", counting)
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ServiceUnreachable) as info:
        Sandbox(dead, "some-token").start()
    msg = str(info.value)
    assert msg == f"cannot reach the sandbox service at {dead} (ConnectError); is `cadence sandbox serve` running?"
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no httpx traceback chained
    assert len(attempts) == 1
