"""User code runs under a uid of its own, not the sandbox agent's nor a judge's.

With the host as root, each sandbox maps two host uids into its user namespace: the agent's (uid 0
inside) and user code's (65534 inside). So what code may do to any process of its own uid (signal
it, open its /proc files, ptrace it) fails against the agent and a judge even where the seccomp
filter and non-dumpability would not stop it: the tests below take those two out of the way
where they can (a judge that makes itself dumpable again) and check what the uid alone stops.
"""

from __future__ import annotations

import os

import pytest

from cadence.sandbox.isolation import UID_RANGE
from cadence.sandbox.sandbox import LocalSandbox
from tests.sandbox.conftest import needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.skipif(
    os.geteuid() != 0, reason="a second uid needs root on the host (without it: one uid, see docs/sandbox.md)")]

UID_OF_PID_1 = "open('/proc/1/status').read().split('Uid:')[1].split()[0]"
# Tries, against process PID, what a process of the same uid may do: signal it, read its
# environment and memory, list its fds. Prints "<what> <errno or 'open'>" for each.
REACH = r'''
import os, signal
def reach(pid):
    out = []
    for what, act in [("signal", lambda: os.kill(pid, 0)), ("stop", lambda: os.kill(pid, signal.SIGSTOP)),
                      ("environ", lambda: open(f"/proc/{pid}/environ", "rb").read()),
                      ("mem", lambda: open(f"/proc/{pid}/mem", "rb").close()),
                      ("fd", lambda: os.listdir(f"/proc/{pid}/fd")), ("kill", lambda: os.kill(pid, signal.SIGKILL))]:
        try:
            act()
            out.append(f"{what} open")
        except OSError as e:
            out.append(f"{what} {e.errno}")
    return " ".join(out)
'''
DENIED = "signal 1 stop 1 environ 13 mem 13 fd 13 kill 1"


@pytest.fixture(scope="module")
def sb():
    with LocalSandbox() as box:
        yield box


def test_user_code_runs_under_another_uid_than_the_agent(sb):
    """Commands, code, both sessions: 65534; the agent (pid 1) and a judge call: 0 inside. On the
    host, two different uids of the sandbox range."""
    assert sb.exec(code=f"import os; print(os.getuid(), os.getgid(), {UID_OF_PID_1})").stdout.split() == ["65534", "65534", "0"]
    assert sb.exec("id -u; id -g").stdout.split() == ["65534", "65534"]
    assert sb.exec(code="import os; print(os.getuid())", session=True).stdout.strip() == "65534"
    assert sb.exec("id -u", session=True).stdout.strip() == "65534"
    assert sb.exec(code="import os; print(os.getuid())", judge=True).stdout.strip() == "0"
    sb.exec("touch mine")
    with open(f"/proc/{sb.agent_pid}/status") as f:
        agent_host_uid = int(f.read().split("Uid:")[1].split()[0])
    code_host_uid = os.stat(f"/proc/{sb.agent_pid}/root/workspace/mine").st_uid
    assert agent_host_uid != code_host_uid
    assert all(UID_RANGE[0] <= uid < UID_RANGE[1] for uid in (agent_host_uid, code_host_uid))


def test_user_code_cannot_signal_or_read_the_agent(sb):
    """Signals to the agent fail with EPERM (before, with one uid, `kill(1, 0)` succeeded)."""
    r = sb.exec(code=REACH + "print(reach(1))")
    assert r.stdout.strip() == DENIED, r.stderr
    assert sb.exec("echo still here").stdout == "still here\n"


def test_a_dumpable_judge_is_out_of_reach_of_the_code_it_starts(sb):
    """A judge call makes itself dumpable again (so non-dumpability does not protect it) and starts
    a child as user code, which tries to signal, stop, read and kill it: only the uid stands in
    the way, and the judge lives on to answer."""
    judge = REACH + r'''
import ctypes, sys
assert ctypes.CDLL(None).prctl(4, 1, 0, 0, 0) == 0  # PR_SET_DUMPABLE: open to its own uid again
ids = os.environ.get("CADENCE_SANDBOX_CODE_ID")  # user code's uid (none: the sandbox has one uid)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    if ids is not None:
        os.setgroups([])
        os.setresgid(int(ids), int(ids), int(ids))
        os.setresuid(int(ids), int(ids), int(ids))
    os.write(w, reach(os.getppid()).encode())
    os._exit(0)
os.close(w)
os.waitpid(pid, 0)
print(os.read(r, 4096).decode())
print("judge alive")
'''
    r = sb.exec(code=judge, judge=True, timeout_s=10)
    assert r.stdout.splitlines() == [DENIED, "judge alive"], (r.stdout, r.stderr)
