"""LocalSandbox: exec of commands and code, stdin, state across calls, files, limits, fallback."""

from __future__ import annotations

import marshal
import os
import struct
import sys
import tempfile
import warnings

import pytest

import cadence.sandbox.isolation as isolation
from cadence.sandbox import (
    ExecRequest,
    IsolationUnavailable,
    Limits,
    LocalSandbox,
    SandboxDied,
    SandboxError,
)
from tests.sandbox.conftest import needs_bwrap

pytestmark = needs_bwrap


def test_exec_command_code_and_stdin(box):
    r = box.exec("echo out; echo err >&2; exit 3")
    assert (r.stdout, r.stderr, r.exit_code, r.limit) == ("out\n", "err\n", 3, None)
    r = box.exec(["python3", "-c", "import sys; print(sys.stdin.read().upper())"], stdin="abc")
    assert r.stdout == "ABC\n" and r.ok
    r = box.exec(code="import sys; print(sum(map(int, sys.stdin.read().split())))", stdin="1 2 3")
    assert r.stdout == "6\n"
    r = box.exec(code="raise ValueError('boom')")
    assert r.exit_code == 1 and "ValueError: boom" in r.stderr
    assert box.exec(code="import sys; sys.exit(4)").exit_code == 4
    assert box.exec("no-such-program-xyz").exit_code == 127


def test_state_persists_across_calls(box):
    """Files, background processes and the Python session's globals survive between calls."""
    box.exec("echo 41 > n.txt")
    assert box.exec(code="print(int(open('n.txt').read()) + 1)").stdout == "42\n"
    first = box.exec(code="counter = 10", session=True)
    assert first.session_started
    second = box.exec(code="counter += 1; print(counter)", session=True)
    assert second.stdout == "11\n" and not second.session_started
    # A one-shot call does not see (or disturb) the session.
    assert "NameError" in box.exec(code="print(counter)").stderr
    assert box.exec(code="print(input())", stdin="typed\n", session=True).stdout == "typed\n"


def test_files_round_trip(box):
    path = box.write_file("dir/data.bin", bytes(range(256)))
    assert path == "/workspace/dir/data.bin"
    assert box.read_file("dir/data.bin") == bytes(range(256))
    assert box.exec("wc -c < dir/data.bin").stdout.strip() == "256"
    with pytest.raises(SandboxError, match="FileNotFoundError"):
        box.read_file("missing.txt")


def test_sandbox_view(box):
    """Runs as uid 65534 in a fresh PID namespace, workspace and /tmp empty, no network."""
    r = box.exec("id -u; pwd; ls -A /tmp; ls -A /workspace; hostname")
    assert r.stdout.split() == ["65534", "/workspace", "sandbox"]
    assert box.exec(code="import os; print(os.getppid() <= 2)").stdout == "True\n"
    assert box.exec("ls /sys/class/net 2>/dev/null || cat /proc/net/dev | tail -n +3 | cut -d: -f1").stdout.split() == ["lo"]


def test_wall_clock_limit_kills_and_sandbox_survives(box):
    r = box.exec(code="while True: pass", timeout_s=0.5)
    assert r.limit == "wall" and r.exit_code == -9
    r = box.exec("sleep 30 & sleep 30; echo never", timeout_s=0.5)
    assert r.limit == "wall" and "never" not in r.stdout
    assert box.exec("ps -e -o comm= | grep -c sleep || true").stdout.strip() == "0"
    assert box.exec("echo alive").stdout == "alive\n"


def test_session_timeout_resets_session(box):
    box.exec(code="x = 1", session=True)
    r = box.exec(code="while True: pass", session=True, timeout_s=0.5)
    assert r.limit == "wall" and r.session_lost
    assert not box.exec(code="x = 2", session=True).session_lost
    r = box.exec(code="import os; os._exit(3)", session=True)
    assert r.session_lost and r.exit_code == 3
    r = box.exec(code="print('x' in globals())", session=True)
    assert r.session_started and r.stdout == "False\n"


def test_shell_session_keeps_cwd_variables_and_functions(box):
    first = box.exec("mkdir -p src && cd src && export STAGE=built && greet() { echo hi $1; }", session=True)
    assert first.ok and first.session_started
    r = box.exec("pwd; echo $STAGE; greet you; cat", session=True, stdin="piped\n")
    assert r.stdout == "/workspace/src\nbuilt\nhi you\npiped\n" and not r.session_started
    assert box.exec("pwd").stdout == "/workspace\n"  # a one-shot call has its own shell
    r = box.exec(["printf", "%s|%s", "it's", "$STAGE"], session=True, env={"EXTRA": "a b"})
    assert r.stdout == "it's|$STAGE"  # an argv is quoted, not expanded
    r = box.exec('echo "$EXTRA"; ls /nope', session=True)
    assert r.stdout == "a b\n" and r.exit_code == 2 and "No such file" in r.stderr
    # The Python session is a separate one, and survives the shell's timeout and exit.
    box.exec(code="kept = 7", session=True)
    r = box.exec("sleep 30", session=True, timeout_s=0.5)
    assert r.limit == "wall" and r.session_lost
    assert box.exec(code="print(kept)", session=True).stdout == "7\n"
    r = box.exec("echo ${STAGE:-gone}; pwd", session=True)
    assert r.session_started and r.stdout == "gone\n/workspace\n"
    r = box.exec("exit 3", session=True)
    assert r.exit_code == 3 and r.session_lost


def test_memory_cpu_file_size_limits(small_box):
    assert small_box.exec(code="x = bytearray(512 << 20)").limit == "memory"
    assert small_box.exec(code="x = bytearray(512 << 20)", session=True).limit == "memory"
    assert small_box.exec(code="while True: pass", timeout_s=30).limit == "cpu"
    r = small_box.exec("head -c 3000000 /dev/zero > big")
    assert r.limit == "file_size" and small_box.exec("stat -c %s big").stdout.strip() == str(1 << 20)
    assert small_box.exec("echo fine").ok


def test_output_is_capped(box):
    r = box.exec(code="import sys; sys.stdout.write('x' * (3 << 20))")
    assert r.output_truncated and len(r.stdout) == 1 << 20 and r.exit_code == 0


def test_exec_needs_exactly_one_of_cmd_or_code(box):
    with pytest.raises(SandboxError, match="exactly one"):
        box.exec(ExecRequest())


def test_a_judge_call_is_one_shot(box):
    """`judge=True` (the agent's uid: a harness that starts the code it judges) is refused for a
    session, which is always user code's."""
    with pytest.raises(ValueError, match="judge=True runs a one-shot call"):
        ExecRequest(code="print(1)", session=True, judge=True)
    assert box.exec(code="print(1)", judge=True).stdout == "1\n"


def test_limits_validate():
    with pytest.raises(ValueError, match="memory_mb"):
        Limits(memory_mb=0)
    with pytest.raises(ValueError, match="extra"):
        Limits(memroy_mb=5)


def test_without_bwrap_refuses_unless_opted_in(monkeypatch):
    monkeypatch.setattr(isolation, "bwrap_path", lambda: None)
    with pytest.raises(IsolationUnavailable, match="apt-get install bubblewrap"):
        LocalSandbox().start()
    with pytest.warns(UserWarning, match="WITHOUT isolation"):
        sb = LocalSandbox(allow_unisolated=True).start()
    try:
        assert not sb.isolated
        assert sb.exec("echo hi > f; cat f").stdout == "hi\n"
        assert sb.exec(code="while True: pass", timeout_s=0.5).limit == "wall"
        with pytest.raises(SandboxError, match="outside the workspace"):
            sb.read_file("/etc/hostname")
    finally:
        sb.stop()
    with warnings.catch_warnings(record=True) as caught:  # every start warns, not just the first
        warnings.simplefilter("default")
        LocalSandbox(allow_unisolated=True).start().stop()
    assert any("WITHOUT isolation" in str(w.message) for w in caught)


def test_sandbox_outlives_the_thread_that_started_it():
    """--die-with-parent follows the forking *thread*; web servers retire worker threads."""
    import threading
    import time

    boxes = []
    t = threading.Thread(target=lambda: boxes.append(LocalSandbox().start()))
    t.start()
    t.join()
    try:
        time.sleep(0.3)
        assert boxes[0].alive and boxes[0].exec("echo alive").stdout == "alive\n"
    finally:
        boxes[0].stop()


def test_agent_from_source_when_bytecode_differs(monkeypatch):
    """A sandbox Python of another version gets the agent's modules as source (compiled code
    only fits the host's bytecode magic)."""
    import marshal

    payload = isolation._agent_payload("00000000")
    parts = marshal.loads(payload)
    assert [name for name, _ in parts] == [f"cadence.sandbox.{m}" for m in isolation.AGENT_MODULES]
    for (_, src), module in zip(parts, isolation.AGENT_MODULES, strict=True):
        with open(os.path.join(isolation.SANDBOX_DIR, f"{module}.py"), "rb") as f:
            assert src == f.read()
    monkeypatch.setattr(isolation, "_agent_payload", lambda magic: payload)
    with LocalSandbox() as sb:
        assert sb.exec(code="print(6 * 7)").stdout == "42\n"
        assert sb.exec("echo $((6 * 7))", session=True).stdout == "42\n"  # agent_sessions came too


def test_agent_exits_when_its_host_goes_away_during_start():
    """If the service dies between starting bwrap and sending the agent, the sandbox ends
    (it once spun forever on the EOF, orphaned, at full CPU)."""
    import subprocess

    from cadence.sandbox import sandbox

    spec = isolation.launch(Limits())
    kw = {"user": spec.user, "group": spec.user, "extra_groups": []} if spec.user is not None else {}
    err = tempfile.TemporaryFile()
    # From the spawner thread: it holds the staged interpreter (a pyenv under /root, as root).
    proc = sandbox._SPAWNER.submit(sandbox._popen, 0, spec.stage, spec.argv, stdin=subprocess.PIPE,
                                   stdout=subprocess.DEVNULL, stderr=err, start_new_session=True, **kw).result()
    proc.stdin.write(spec.preamble[:100])  # part of the agent, then the host "dies"
    proc.stdin.close()
    try:
        assert proc.wait(timeout=60) != 0
        err.seek(0)
        assert b"bwrap" not in err.read()  # the agent itself gave up, not bwrap
    finally:
        proc.kill()
        proc.wait()
        err.close()


def test_the_host_interpreter_and_its_packages_are_there_read_only():
    """The Python running cadence (here a pyenv under /root, which the sandbox's uid could not
    read: staged) is the sandbox's, at a neutral path, with its site-packages importable from
    code and from commands, and nothing of it writable."""
    import numpy

    with LocalSandbox(Limits(wall_s=20, cpu_s=20)) as sb:
        r = sb.exec(code="import sys, numpy; print(sys.version); print(sys.executable); print(numpy.__file__)")
        version, exe, numpy_file = r.stdout.strip().splitlines()
        assert version == sys.version
        if not sys.base_prefix.startswith("/usr"):  # neutral paths: the installation's, or a venv's
            assert exe.startswith((isolation.PYTHON_HOME + "/", isolation.VENV_ROOT + "/"))
            assert numpy_file.startswith((isolation.PYTHON_HOME + "/", isolation.VENV_ROOT + "/"))
        assert sb.exec("python3 -c 'import numpy; print(numpy.__version__)'").stdout.strip() == numpy.__version__
        w = sb.exec(f"touch {os.path.dirname(numpy_file)}/x {os.path.dirname(exe)}/x")
        assert w.exit_code != 0 and "Read-only file system" in w.stderr
        assert not os.path.exists(os.path.join(os.path.dirname(numpy.__file__), "x"))


def test_python_packages_none_is_the_standard_library_only():
    with LocalSandbox(Limits(wall_s=20, cpu_s=20), python_packages="none") as sb:
        assert "No module named 'numpy'" in sb.exec(code="import numpy").stderr
        assert sb.exec("python3 -c 'import numpy'").exit_code != 0
        r = sb.exec(code="import json, site, os; print(sum(len(os.listdir(d)) for d in site.getsitepackages() if os.path.isdir(d)))")
        assert r.stdout == "0\n"  # the site-packages folders are covered up, not just off sys.path
    with pytest.raises(ValueError, match="python_packages"):
        LocalSandbox(python_packages="all").start()


def test_a_venv_interpreter_brings_its_own_packages_only(tmp_path):
    """python= a venv: a venv inside too (at /opt/venv, its site-packages importable from code and
    commands), its base's packages hidden."""
    import subprocess

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, timeout=120)
    site_dir = tmp_path / "venv" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site_dir / "venvmod.py").write_text("X = 42\n")
    with LocalSandbox(Limits(wall_s=20, cpu_s=20), python=str(tmp_path / "venv" / "bin" / "python")) as sb:
        assert sb.exec(code="import venvmod; print(venvmod.X)").stdout == "42\n"
        r = sb.exec("python3 -c 'import venvmod; print(venvmod.__file__)'; python3 -c 'import numpy'")
        venv_site = f"{isolation.VENV_ROOT}/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
        assert r.stdout == f"{venv_site}/venvmod.py\n" and "No module named 'numpy'" in r.stderr, r
        # A child started with an emptied environment in isolated mode (what the code env's
        # executor does) is still the venv's interpreter, with its packages.
        r = sb.exec(code="import subprocess, sys; subprocess.run([sys.executable, '-I', '-c', 'import venvmod'], env={}, check=True); print('ok')")
        assert r.stdout == "ok\n", r


def test_replies_never_shift_after_a_failed_call(box):
    """Finding 4 of issue 26: timeout_s=1e308 ran the command, the host overflowed before reading
    the reply, and every later call read the previous call's reply. Now a huge finite timeout just
    works on the host side (the request models bound it too), and a reply that is not the call's
    (here a stray frame the agent answers first) stops the sandbox instead of being returned."""
    huge = {"op": "exec", "cmd": "echo first", "code": None, "timeout": 1e308, "cpu_s": 5}
    assert box._call(huge, 1e308)["stdout"] == "first\n"
    assert box.exec("echo second").stdout == "second\n"
    stray = marshal.dumps({"op": "ping"}, 4)
    box.proc.stdin.write(struct.pack(">I", len(stray)) + stray)  # answered before the next call
    with pytest.raises(SandboxDied, match="not this call's"):
        box.exec("echo third")
    assert not box.alive  # a pool replaces it; nothing can read the leftover reply
