"""The judge's run: each test under its own deadline in a fresh worker, then the verdict line
`<nonce> <passed> <timed out>` on the judge's own stdout, the only output the host reads. The last
part of the judge's program (judge/__init__.py)."""

import _signal as signal
import os
import sys
import time

if False:  # what the program defines before this part (judge/__init__.py); for readers and linters
    from cadence.rewards.judge.codec import loads
    from cadence.rewards.judge.handles import Names
    from cadence.rewards.judge.workers import ZYGOTES, Abort, TimedOut, Worker, Zygote

P = loads(globals()["PARAMS"])


class TestTimeout(BaseException):
    """A test ran past test_timeout_s (SIGALRM): in its own code, or waiting in a system call."""


def on_alarm(signum, frame):
    raise TestTimeout()


PASS, FAIL, TIMEOUT = "pass", "fail", "timeout"


def worker_for(deadline: float) -> Worker:
    """A fresh worker from the zygote. A zygote that is gone or stuck (the solution of an earlier
    test killed or stopped it: it is the user's) is replaced, once."""
    for attempt in (0, 1):
        if not ZYGOTES:
            ZYGOTES.append(Zygote())
        try:
            return ZYGOTES[0].fork(deadline)
        except (Abort, OSError):
            ZYGOTES.pop().close()
            if attempt:
                raise
    raise AssertionError("unreachable")


def run_test(test: str, index: int, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)  # a test of its own that loops
    worker = None
    try:
        worker = worker_for(deadline)
        if worker.ask({"path": sys.path, "solution": P["solution"]})[0] != "ok":
            return FAIL  # the solution itself failed (raised, exited)
        exec(compile(test, f"test_{index}", "exec"), Names(worker))
        return PASS
    except (TimedOut, TestTimeout):
        return TIMEOUT
    except BaseException:  # a failed assert, an error, a worker that exited or could not start
        return FAIL
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        if worker is not None:
            worker.close()


def main() -> None:
    verdict = os.dup(1)  # ours alone: whatever the tests print goes to /dev/null, not before it
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    results = [run_test(test, i, P["timeout_s"]) for i, test in enumerate(P["tests"])]
    for zygote in ZYGOTES:
        zygote.close()
    os.write(verdict, f"{P['nonce']} {results.count(PASS)} {results.count(TIMEOUT)}\n".encode())
    os._exit(0)


main()
