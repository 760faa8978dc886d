"""The judge's side of the user's processes (zygote.py): start the zygote as user code, fork a
worker per test from it, ask a worker and read its answer within the test's deadline, kill it.
The second part of the judge's program (judge/__init__.py), after codec.py."""

import _socket
import os
import struct
import sys

if False:  # what the program defines before this part (judge/__init__.py); for readers and linters
    from cadence.rewards.judge import ZYGOTE
    from cadence.rewards.judge.codec import dumps, loads

CODE_ID = os.environ.get("CADENCE_SANDBOX_CODE_ID")  # user code's uid and gid; unset: ours


def start_as_user(ctl: int) -> int:
    """Fork and exec the zygote as user code (CODE_ID, where it has a uid of its own), holding
    nothing of ours but `ctl` (as its fd 3); its own session, so it can be killed with its own."""
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(ctl, 3)  # over the verdict's fd, if it was 3: the child must not hold it
            os.set_inheritable(3, True)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(4, 1 << 16)
            os.setsid()
            if CODE_ID is not None:
                ids = int(CODE_ID)
                os.setgroups([])
                os.setresgid(ids, ids, ids)
                os.setresuid(ids, ids, ids)  # from uid 0 inside: every capability goes with it
            os.execv(sys.executable, [sys.executable, "-I", "-S", "-c", ZYGOTE])
        finally:
            os._exit(127)
    return pid


class Zygote:
    """A fresh interpreter of the user's (exec'd: none of our memory) that forks a worker per
    test: a fresh process per test, without an interpreter start-up per test."""

    def __init__(self) -> None:
        self.ctl, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            self.pid = start_as_user(theirs.fileno())
        finally:
            theirs.close()
        self.ready = False

    def fork(self, deadline: float) -> "Worker":
        if not self.ready:
            if self._recv(1, deadline) != b"r":
                raise Abort("the zygote did not start")
            self.ready = True
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        try:
            self.ctl.sendmsg([b"f"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack("2i", to_r, from_w))])
            pid = int.from_bytes(self._recv(4, deadline), "big")
        except BaseException:
            os.close(to_w)
            os.close(from_r)
            raise
        finally:
            os.close(to_r)
            os.close(from_w)
        return Worker(pid, to_w, from_r, deadline)

    def _recv(self, n: int, deadline: float) -> bytes:
        buf = b""
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimedOut("the zygote did not answer in time")
            if not select.select([self.ctl], [], [], left)[0]:
                continue
            chunk = self.ctl.recv(n - len(buf))
            if not chunk:
                raise Abort("the zygote is gone")
            buf += chunk
        return buf

    def close(self) -> None:
        self.ctl.close()
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


# Started first: the zygote's interpreter starts while this one imports the rest and reads its
# parameters. (No process left to start one: the first test tries again, and fails.)
ZYGOTES: list[Zygote] = []  # the call's zygote (replaced after it broke)
try:
    ZYGOTES.append(Zygote())
except OSError:
    pass

import _signal as signal  # noqa: E402  (the signal module imports enum: milliseconds)
import select  # noqa: E402
import time  # noqa: E402

MAX_REPLY = 16 << 20  # bytes of one answer from the worker; more fails the test


class Abort(BaseException):
    """The worker died, hung or exited: the test fails (never caught by a test's `except`)."""


class TimedOut(Abort):
    """The solution (or its zygote) did not answer within the test's time."""


class Worker:
    """One test's process of the solution (a fork of the zygote): asked, it answers."""

    def __init__(self, pid: int, to_w: int, from_r: int, deadline: float) -> None:
        self.pid, self.to_w, self.from_r, self.deadline = pid, to_w, from_r, deadline

    def ask(self, req: list | dict) -> list:
        data = dumps(req).encode()
        data = struct.pack(">I", len(data)) + data
        try:
            while data:
                data = data[os.write(self.to_w, data):]
        except OSError:
            raise Abort("the solution's process is gone") from None
        head = self._read(4)
        n = struct.unpack(">I", head)[0]
        if n > MAX_REPLY:
            raise Abort(f"an answer of {n} bytes")
        return loads(self._read(n).decode())

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimedOut("the solution did not answer in time")
            if not select.select([self.from_r], [], [], left)[0]:
                continue
            chunk = os.read(self.from_r, n - len(buf))
            if not chunk:
                raise Abort("the solution's process exited")
            buf += chunk
        return buf

    def close(self) -> None:
        for fd in (self.to_w, self.from_r):
            os.close(fd)
        try:
            os.killpg(self.pid, signal.SIGKILL)  # the worker and what it started in its session
        except OSError:
            pass
