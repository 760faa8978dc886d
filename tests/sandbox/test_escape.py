"""Escape suite: what model-written code tries, and what must stay contained.

Each test runs the attack inside a sandbox and then checks, from the host, that it had no
effect and that the sandbox still serves the next call. To see the suite catch a broken
sandbox, run it without isolation: `CADENCE_ESCAPE_UNISOLATED=1 pytest tests/sandbox/test_escape.py`
(the rlimits-only fallback): the file, network and signal tests then fail.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid

import pytest

import cadence.sandbox.isolation as isolation
from cadence.sandbox import Limits, LocalSandbox, SandboxDied, cgroup, staging
from cadence.sandbox.isolation import Mount
from tests.sandbox.conftest import needs_bwrap

pytestmark = needs_bwrap
UNISOLATED = os.environ.get("CADENCE_ESCAPE_UNISOLATED") == "1"
LIMITS = Limits(memory_mb=256, processes=64, file_size_mb=8, disk_mb=16, cpu_s=2, wall_s=3)


def make_box(limits: Limits = LIMITS) -> LocalSandbox:
    return LocalSandbox(limits, allow_unisolated=UNISOLATED).start()


@pytest.fixture
def escape_box(monkeypatch):
    if UNISOLATED:
        monkeypatch.setattr(isolation, "bwrap_path", lambda: None)
    sb = make_box()
    yield sb
    assert sb.exec("echo next").stdout == "next\n", "the sandbox must serve the call after an attack"
    sb.stop()


@pytest.fixture
def planted(tmp_path_factory):
    """A secret file in the host's home and one in the host's /tmp."""
    secret = uuid.uuid4().hex
    paths = [os.path.join(os.path.expanduser("~"), f".cadence_escape_{secret[:8]}"),
             os.path.join("/tmp", f"cadence_escape_{secret[:8]}")]
    for p in paths:
        with open(p, "w") as f:
            f.write(secret)
        os.chmod(p, 0o644)
    yield secret, paths
    for p in paths:
        os.remove(p)


def test_read_files_planted_on_the_host(escape_box, planted):
    secret, paths = planted
    for p in paths:
        for attempt in (f"cat {p}", f"cat /proc/1/root{p}", f"cat /proc/self/root{p}",
                        f"cd / && cat ../../..{p}"):
            assert secret not in escape_box.exec(attempt).stdout, attempt
        code = f"print(open({p!r}).read())"
        assert secret not in escape_box.exec(code=code).stdout
    # Nor the project checkout this test runs from.
    assert escape_box.exec(["cat", os.path.abspath(__file__)]).exit_code != 0


def test_the_interpreter_and_hosted_code_show_nothing_else_of_the_host(monkeypatch, planted):
    """What a hosted built-in environment's sandbox gets beyond /usr: the host interpreter (here
    a pyenv in /root, staged for the sandbox's uid) at /opt/python and the installed cadence
    package at /opt/code/cadence, read-only. Not /root, not the checkout around the package (its
    tests, README, .git), not the host's /tmp, not the staging folder; and the staging mounts
    exist in the spawner thread's namespace only, not on the host."""
    if UNISOLATED:
        monkeypatch.setattr(isolation, "bwrap_path", lambda: None)
    import cadence

    secret, _ = planted
    package = os.path.dirname(os.path.abspath(cadence.__file__))
    checkout = os.path.dirname(package)
    sb = LocalSandbox(LIMITS, allow_unisolated=UNISOLATED, mounts=(Mount(package, "/opt/code/cadence"),)).start()
    try:
        usable = sb.exec(code="import sys; sys.path.insert(0, '/opt/code'); import cadence; print(cadence.__file__)")
        assert usable.stdout == "/opt/code/cadence/__init__.py\n", usable.stderr
        listing = sb.exec(code="import os; print(sorted(os.listdir('/'))); print(sorted(os.listdir('/opt')));"
                               "print(os.listdir('/opt/code')); print(os.listdir('/tmp'))").stdout.splitlines()
        assert set(eval(listing[0])) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "opt", "proc", "sbin",
                                         "tmp", "usr", "workspace"}, listing[0]
        # /opt/venv: the venv cadence runs from, when it runs from one (its site-packages, read-only)
        assert set(eval(listing[1])) <= {"code", "python", "site", "venv"} and listing[2:] == ["['cadence']", "[]"]
        for path in ("/root", os.path.expanduser("~"), checkout, os.path.join(checkout, "README.md"),
                     os.path.abspath(__file__), "/opt/code/cadence/../README.md", "/opt/code/tests",
                     "/opt/python/../../root", "/proc/1/root/root", staging.ROOT):
            r = sb.exec(f"ls -d {path} && cat {path}")
            assert r.exit_code != 0 and secret not in r.stdout, path
        found = sb.exec("find / -path /proc -prune -o -path /usr -prune -o -path /opt/python -prune "
                        "-o -name '*cadence_escape*' -print 2>/dev/null").stdout
        assert found == "", found
        for target in ("/opt/python/pwned", "/opt/code/cadence/pwned", "/opt/code/pwned"):
            assert sb.exec(f"echo pwned > {target}").exit_code != 0, target
        assert not os.path.exists(os.path.join(package, "pwned"))
    finally:
        sb.stop()
    with open("/proc/self/mountinfo") as f:  # this test's main thread: the host's mount table
        assert "cadence-sandbox-stage" not in f.read()
    for entry in os.listdir(staging.ROOT) if os.path.isdir(staging.ROOT) else []:  # empty mount points only
        full = os.path.join(staging.ROOT, entry)
        assert (os.listdir(full) == []) if os.path.isdir(full) else os.path.getsize(full) == 0


def test_write_outside(escape_box, tmp_path):
    name = f"cadence_escape_{uuid.uuid4().hex[:8]}"
    targets = [f"/tmp/{name}", os.path.join(os.path.expanduser("~"), name), f"/usr/{name}",
               str(tmp_path / name), os.path.join(os.path.dirname(os.path.abspath(__file__)), name)]
    for t in targets:
        escape_box.exec(f"mkdir -p {os.path.dirname(t)} 2>/dev/null; echo pwned > {t}")
        escape_box.exec(code=f"open({t!r}, 'w').write('pwned')")
    for t in targets:
        assert not os.path.exists(t), t


def test_tcp_connection_to_host_loopback(escape_box):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(5)
    port = server.getsockname()[1]
    accepted = []

    def accept() -> None:
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    t = threading.Thread(target=accept)
    t.start()
    code = (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "s.sendall(b'hello'); print('connected')")
    r = escape_box.exec(code=code)
    server.close()
    t.join()
    assert "connected" not in r.stdout and not accepted
    # No route anywhere else either (a public address, DNS).
    r = escape_box.exec(code="import socket; socket.create_connection(('1.1.1.1', 53), timeout=2); print('out')")
    assert "out" not in r.stdout


def test_fork_bomb(escape_box):
    # `exec sleep`: the shell must outlive a full process table (a fork for `sleep` could fail).
    r = escape_box.exec("bomb() { bomb | bomb & }; bomb; exec sleep 10", timeout_s=2)
    assert r.limit == "wall"
    r = escape_box.exec(code="import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
                        timeout_s=2)
    assert r.limit == "wall"
    # Everything the bomb started is gone; only the agent is left in the sandbox.
    code = "import os; print([p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()])"
    assert escape_box.exec(code=code).stdout == "['1']\n"


def test_fork_bomb_cannot_exceed_the_process_limit(escape_box):
    code = ("import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
            "            time.sleep(30); os._exit(0)\n        n += 1\nexcept OSError:\n    print(n)")
    r = escape_box.exec(code=code)
    assert 0 < int(r.stdout) < LIMITS.processes


def test_memory_bomb(escape_box):
    r = escape_box.exec(code="chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))")
    assert r.limit == "memory"
    r = escape_box.exec("python3 -c 'x = \"a\" * (1 << 34)'")
    assert r.exit_code != 0


# Each process stays under its own RLIMIT_AS (256 MiB); together they would hold 600 MiB.
SPREAD_BOMB = """
import os, time
kids = []
for i in range(4):
    pid = os.fork()
    if pid == 0:
        x = b'x' * (150 << 20)
        time.sleep(0.5)
        os._exit(0)
    kids.append(pid)
print(sum(os.waitpid(k, 0)[1] != 0 for k in kids))
"""


@pytest.mark.skipif(not cgroup.available(), reason="needs a writable memory cgroup (cgroup v1 here)")
def test_memory_bomb_spread_over_processes(escape_box):
    """Many processes, each under the per-process limit: the sandbox's cgroup holds their total
    to memory_mb, and the kernel kills processes of this sandbox only."""
    r = escape_box.exec(code=SPREAD_BOMB, timeout_s=20)
    assert r.limit == "memory" and int(r.stdout) >= 1, r
    usage = escape_box.usage()
    assert usage["memory_mb"] < LIMITS.memory_mb and usage["cpu_s"] > 0 and usage["processes"] >= 1


def test_disk_filling_write(escape_box):
    """One big file stops at file_size_mb; many files stop at the workspace size (disk_mb)."""
    r = escape_box.exec("cat /dev/zero > big")
    assert r.limit == "file_size"
    code = ("import os\ni = 0\ntry:\n    while True:\n        open(f'f{i}', 'wb').write(b'x' * (4 << 20)); i += 1\n"
            "except OSError as e:\n    print(e.errno)")
    r = escape_box.exec(code=code)
    assert r.stdout.strip() == "28"  # ENOSPC
    used = int(escape_box.exec("du -sm /workspace | cut -f1").stdout)
    assert used <= LIMITS.disk_mb


def test_infinite_loop(escape_box):
    assert escape_box.exec(code="while True: pass").limit in {"wall", "cpu"}
    assert escape_box.exec("while :; do :; done").limit in {"wall", "cpu"}


def test_kill_the_parent_and_the_service(escape_box):
    me = os.getpid()
    attacks = ["kill -9 -1", "kill -9 1", "kill -9 $PPID", f"kill -9 {me}", f"kill -9 {os.getppid()}",
               "pkill -9 -f pytest; pkill -9 python"]
    for attack in attacks:
        escape_box.exec(attack)
        assert os.getpid() == me  # still here to check
    assert escape_box.exec("echo agent alive").stdout == "agent alive\n"


def test_read_another_sandboxs_workspace(escape_box):
    other = make_box()
    try:
        secret = uuid.uuid4().hex
        other.write_file("secret.txt", secret)
        r = escape_box.exec("cat /workspace/secret.txt; grep -rs " + secret + " / --exclude-dir=proc --exclude-dir=sys")
        assert secret not in r.stdout
        r = escape_box.exec("for p in /proc/[0-9]*; do cat $p/root/workspace/secret.txt; done 2>/dev/null")
        assert secret not in r.stdout
    finally:
        other.stop()


def test_hung_agent_is_detected():
    """An agent that stops answering is killed and reported dead, not waited on forever."""
    sb = make_box()
    try:
        os.kill(sb.agent_host_pid(), 19)  # SIGSTOP the agent
        with pytest.raises(SandboxDied):
            sb._call({"op": "ping"}, 0.5, grace=0.5)
        assert not sb.alive
    finally:
        sb.stop()


# Run inside a sandbox: every way to reach the agent (pid 1) or the process that started this one
# (a judge, for a unit-test worker) beyond signals, and nested namespaces; one line per attempt.
REACH_THE_AGENT = r'''
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, ok):
    print(name, "open" if ok else "denied")
def tries(pid, who):
    attempt(f"ptrace {who}", libc.ptrace(0x4206, pid, 0, 0) == 0)  # PTRACE_SEIZE
    buf = ctypes.create_string_buffer(8)
    iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)
    attempt(f"process_vm_readv {who}", libc.process_vm_readv(pid, iov, 1, iov, 1, 0) != -1 or ctypes.get_errno() != 1)
    for what in ("mem", "fd"):
        try:
            open(f"/proc/{pid}/mem", "rb").close() if what == "mem" else os.listdir(f"/proc/{pid}/fd")
            attempt(f"/proc/{who}/{what}", True)
        except OSError:
            attempt(f"/proc/{who}/{what}", False)
tries(1, "agent")
if os.fork() == 0:  # a child of this code call: its parent is a fork of the agent, as a judge is
    tries(os.getppid(), "parent")
    os._exit(0)
os.wait()
attempt("nested user namespace", libc.unshare(0x10000000) == 0)  # CLONE_NEWUSER
attempt("mount", libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) == 0)
attempt("/dev/shm beyond disk_mb", os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize > (17 << 20))
'''


def test_code_cannot_reach_the_agent_or_its_parent(escape_box):
    """Finding 2 of issue 26: code ptraced the agent (same uid, dumpable, no seccomp) and wrote a
    reply of its own on the host pipe. Now: a seccomp filter (no ptrace, process_vm_*, unshare,
    mount), the agent and its forks non-dumpable (no /proc/PID/mem or fd), /dev/shm sized."""
    r = escape_box.exec(code=REACH_THE_AGENT)
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 11 and all(line.endswith(" denied") for line in lines), r.stdout
    assert escape_box.exec("unshare -U true").exit_code != 0  # the command as well as the syscall


def test_no_debuggers_or_compilers_unless_asked():
    """Finding 2 of issue 26: the host's /usr brought gdb and gcc in. The view hides debuggers,
    tracers, compilers and linkers (and their back ends) unless dev_tools=True asks for them."""
    tools = "gdb gcc cc strace ltrace ld as objdump"
    present = [t for t in tools.split() if os.path.exists(f"/usr/bin/{t}")]
    if not present:
        pytest.skip("this host has none of the tools to hide")
    look = f"for t in {' '.join(present)}; do command -v $t; done; ls /usr/lib/gcc 2>/dev/null | wc -l"
    with LocalSandbox(LIMITS) as sb:
        r = sb.exec(look)
        assert r.stdout.splitlines() == ["0"], r.stdout  # none on PATH; /usr/lib/gcc empty
        assert sb.exec("ls /bin/sh /usr/bin/env && python3 -c 'print(1)'").exit_code == 0
    with LocalSandbox(LIMITS, dev_tools=True) as sb:
        assert len(sb.exec(look).stdout.splitlines()) == len(present) + 1
