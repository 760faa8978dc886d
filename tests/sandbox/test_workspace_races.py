"""Code inside a sandbox racing the host's workspace calls (issue 33, findings 1-3): it defeats
SIGSTOP (inotify sends it SIGCONT as soon as the host touches the workspace) while it swaps
regular files (or folders) with symlinks to a host path by renameat2(RENAME_EXCHANGE). The host
copies, snapshots and seeds meanwhile; a root-only host file must never come back, and nothing
may be written outside the workspace. Each test runs both with the cgroup freezer and with it
unavailable (SIGSTOP only, which the code defeats): the path handling must hold on its own."""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
import time
import uuid

import pytest

from cadence.sandbox import Limits, LocalSandbox, workspace
from cadence.sandbox.cgroup import SandboxCgroup
from cadence.sandbox.models import SandboxError
from tests.sandbox.conftest import needs_bwrap

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the host reaches a workspace as root only")
# Seconds per test and mode. Before the fix the racer won every snapshot run within 1 s and every
# copy run within 5 s; seeds, slower to win, get twice as long (docs/sandbox.md has the counts).
RACE_S = 3.0
PAIRS = 16  # file/link pairs swapped round-robin
RACER_LIMITS = Limits(wall_s=10)

# Runs inside the sandbox, in the background: argv[1] = "files" (regular files swapped with
# links to argv[2]) or "folders" (folders swapped with links to the host folder argv[2]).
RACER = r"""
import ctypes, fcntl, os, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
mode, target, pairs, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])

# SIGSTOP, defeated: inotify on the workspace signals this process (F_SETSIG: SIGCONT, which
# continues a stopped process when it is sent) whenever the host opens or reads an entry of it.
signal.signal(signal.SIGCONT, lambda *_: None)
events = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
assert events >= 0 and libc.inotify_add_watch(events, b".", 0xFFF) >= 0  # IN_ALL_EVENTS
fcntl.fcntl(events, fcntl.F_SETOWN, os.getpid())
fcntl.fcntl(events, 10, signal.SIGCONT)  # F_SETSIG
fcntl.fcntl(events, fcntl.F_SETFL, fcntl.fcntl(events, fcntl.F_GETFL) | os.O_ASYNC)

RENAME_EXCHANGE, SYS_RENAMEAT2, AT_FDCWD = 2, {"x86_64": 316, "aarch64": 276}[os.uname().machine], -100
for i in range(pairs):
    if mode == "files":
        with open(f"f{i}", "w") as f:
            f.write("harmless\n")
    else:
        os.mkdir(f"f{i}")
    os.symlink(target, f"l{i}")
open("ready", "w").close()
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    for i in range(pairs):
        libc.syscall(SYS_RENAMEAT2, AT_FDCWD, f"f{i}".encode(), AT_FDCWD, f"l{i}".encode(), RENAME_EXCHANGE)
    try:
        os.read(events, 1 << 16)  # drained, so the queue never overflows (and signals on)
    except BlockingIOError:
        pass
"""


@pytest.fixture(params=["freezer", "sigstop-only"])
def freezing(request, monkeypatch):
    if request.param == "sigstop-only":  # a host without a cgroup freezer
        monkeypatch.setattr(SandboxCgroup, "can_freeze", lambda self: False)
    return request.param


@pytest.fixture
def secret():
    """A root-only host file (mode 0600 in a mode 0700 folder) and its content (a tar entry stat'ed
    as the racer's 9-byte file copies the first 9 bytes of whatever it opens: those are checked)."""
    folder = tempfile.mkdtemp(prefix="cadence-secret-")
    path = os.path.join(folder, "secret")
    content = f"SECRET-{uuid.uuid4().hex}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, content.encode())
    os.close(fd)
    yield path, content
    os.unlink(path)
    os.rmdir(folder)


def _start_racer(box: LocalSandbox, mode: str, target: str) -> None:
    box.write_file("racer.py", RACER)
    r = box.exec(f"setsid python3 racer.py {mode} {target} {PAIRS} {RACE_S + 30} > racer.log 2>&1 &")
    assert r.exit_code == 0, r.stderr
    deadline = time.monotonic() + 10
    while box.exec("test -e ready").exit_code != 0:
        assert time.monotonic() < deadline, box.exec("cat racer.log").stdout
        time.sleep(0.05)


def _regular_files_hold(root: str, needle: str) -> bool:
    """Whether any regular file under `root` (walked as root, links not followed) holds `needle`."""
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as f:
                if needle.encode() in f.read():
                    return True
    return False


@needs_bwrap
@needs_root
def test_copy_never_reads_a_host_file_through_a_swapped_link(freezing, secret):
    path, content = secret
    with LocalSandbox(RACER_LIMITS) as src, LocalSandbox(RACER_LIMITS) as dst:
        _start_racer(src, "files", path)
        tries, deadline = 0, time.monotonic() + RACE_S
        while time.monotonic() < deadline:
            workspace.copy_workspace(src, dst)
            tries += 1
            assert not _regular_files_hold(workspace.host_path(dst), content[:9]), f"leaked on copy {tries}"
        assert tries > 0


@needs_bwrap
@needs_root
def test_snapshot_never_reads_a_host_file_through_a_swapped_link(freezing, secret):
    path, content = secret
    with LocalSandbox(RACER_LIMITS) as box:
        _start_racer(box, "files", path)
        tries, deadline = 0, time.monotonic() + RACE_S
        while time.monotonic() < deadline:
            tar = workspace.snapshot(box)
            tries += 1
            assert content[:9].encode() not in tar, f"leaked on snapshot {tries}"  # 9: the size the entry claimed
        names = tarfile.open(fileobj=io.BytesIO(tar)).getnames()
        assert "racer.py" in names and "f0" in names and "l0" in names


@needs_bwrap
@needs_root
def test_seed_never_writes_through_a_swapped_link(freezing):
    outside = tempfile.mkdtemp(prefix="cadence-world-writable-")  # /tmp: reachable by any uid
    os.chmod(outside, 0o777)
    try:
        with LocalSandbox(RACER_LIMITS) as box:
            _start_racer(box, "folders", outside)
            tries, deadline = 0, time.monotonic() + 2 * RACE_S
            while time.monotonic() < deadline:
                try:
                    workspace.seed(box, files={f"f{i}/seeded": "x" for i in range(PAIRS)})
                except SandboxError as e:  # a link (or, raced, a file) where a folder was: refused
                    assert "goes through the symlink" in str(e) or "is not a folder" in str(e)
                tries += 1
                assert os.listdir(outside) == [], f"written outside the workspace on seed {tries}"
    finally:
        for name in os.listdir(outside):
            os.unlink(os.path.join(outside, name))
        os.rmdir(outside)


@needs_bwrap
@needs_root
def test_a_frozen_sandbox_cannot_change_its_workspace(secret):
    """The racer's inotify SIGCONT undoes SIGSTOP as soon as the host lists the workspace; the
    cgroup freezer holds: the same names are links, and the same are files, all along."""
    with LocalSandbox(RACER_LIMITS) as box:
        if box.cgroup is None or not box.cgroup.can_freeze():
            pytest.skip("no cgroup freezer here (cgroup v1 freezer or v2 cgroup.freeze)")
        _start_racer(box, "files", secret[0])
        ws = workspace.host_path(box)
        for _ in range(10):
            with workspace.stopped(box):
                states, deadline = set(), time.monotonic() + 0.05
                while time.monotonic() < deadline:
                    os.listdir(ws)  # an inotify event: SIGCONT to the racer
                    states.add(tuple(os.path.islink(os.path.join(ws, f"f{i}")) for i in range(PAIRS)))
                assert len(states) == 1
