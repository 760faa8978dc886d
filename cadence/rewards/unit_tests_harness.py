"""The unit-test judge: runs inside the sandbox as one `judge=True` call (at the sandbox agent's
uid where user code has one of its own); never runs model code itself.

Sent as source by cadence/rewards/unit_tests.py with `PARAMS` (JSON: the tests, the solution,
the per-test timeout and the call's nonce) defined in front of it. Standard library only.

The solution runs in *workers*, as user code (the uid in $CADENCE_SANDBOX_CODE_ID: it can neither
signal, ptrace nor read the /proc of this process). One *zygote* per call, a fresh interpreter
(exec'd, so it holds none of this process's memory: no tests, no nonce), forks a worker per test
(a fresh process per test, without an interpreter start-up per test). A worker runs the solution
and then only answers questions: "what is the name `add`", "call handle 3 with (2, 3)",
"attribute `push` of handle 5", "the items of handle 7". The test itself runs here, in the judge,
with every name it does not define itself (and that is not a builtin) looked up in the worker.
Answers cross as plain data of exact built-in types (None, bool, int, float, complex, str, bytes,
list, tuple, dict, set, frozenset); anything else stays in the worker behind a `Handle`, which
can be called, indexed, iterated, measured (len) and asked for attributes, but refuses to
compare, hash or be truthy. So:

* comparisons (`==`, `<`, `in`, truthiness) are always between built-in values, with built-in
  semantics: an object whose `__eq__` says yes to everything stays a Handle and fails the test;
* the expected values never enter the worker, which sees only the arguments of its calls;
* the worker can lie only about what the solution computed, which is what a solution does;
  exiting, raising SystemExit or KeyboardInterrupt, patching builtins, unittest or pytest,
  printing, or killing its zygote all happen on the user's side and fail a test at most;
* a test that runs out of time (the solution did not answer, or the test did not end, within
  test_timeout_s) is counted: the host then scores the whole solution 0, as a judge's "time
  limit exceeded" (time spent must never buy a partial result);
* the verdict is printed by this process only, on its own stdout (workers' output goes to
  /dev/null and they hold no fd of ours), as `<nonce> <passed> <timed out>`: the host trusts
  that line only, with the nonce it made for this call, and only when the call exited 0 within
  its limits.
"""

import _socket
import os
import struct
import sys

# Plain data of exact built-in types as tagged JSON, both ways: source shared by the judge (exec'd
# here) and the worker (sent as its first lines). Exact types (`type(v) is int`), not isinstance:
# a subclass with its own __eq__ is not plain data.
CODEC = r'''
import _json

class _Decoder:  # what _json's scanner asks of a decoder (the json package, with re, costs more)
    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int = float, int

    def parse_constant(name):
        raise ValueError(f"not plain JSON: {name}")

_scan = _json.make_scanner(_Decoder)

def loads(text):
    value, end = _scan(text, 0)
    if end != len(text):
        raise ValueError("not one JSON value")
    return value

def dumps(v):
    t = type(v)
    if t is str:
        return _json.encode_basestring_ascii(v)
    if v is None or t is bool:
        return {None: "null", True: "true", False: "false"}[v]
    if t is int:
        return int.__repr__(v)
    if t is list or t is tuple:
        return "[" + ",".join([dumps(x) for x in v]) + "]"
    if t is dict:
        return "{" + ",".join([dumps(k) + ":" + dumps(x) for k, x in v.items()]) + "}"
    raise TypeError(f"cannot send a {t.__name__}")

SEQS = {list: "l", tuple: "t", set: "S", frozenset: "F"}
KINDS = {tag: kind for kind, tag in SEQS.items()}

def encode(v, other, depth=0):
    t = type(v)
    if v is None:
        return ["n"]
    if t is bool or t is str:
        return ["b" if t is bool else "s", v]
    if t is int:
        return ["i", format(v, "x")]
    if t is float:
        return ["f", v.hex()]
    if t is complex:
        return ["c", v.real.hex(), v.imag.hex()]
    if t is bytes:
        return ["y", v.hex()]
    if depth < 50 and t in SEQS:
        return [SEQS[t], [encode(x, other, depth + 1) for x in v]]
    if depth < 50 and t is dict:
        return ["d", [[encode(k, other, depth + 1), encode(x, other, depth + 1)] for k, x in v.items()]]
    return other(v)  # not plain data: the worker keeps it (a handle), the judge refuses it

def decode(e, handle):
    tag = e[0]
    if tag == "h":
        return handle(int(e[1]))
    if tag == "d":
        return {decode(k, handle): decode(x, handle) for k, x in e[1]}
    if tag in KINDS:
        return KINDS[tag](decode(x, handle) for x in e[1])
    if tag == "n":
        return None
    if tag in ("b", "s"):
        return (bool if tag == "b" else str)(e[1])
    if tag == "i":
        return int(str(e[1]), 16)
    if tag == "f":
        return float.fromhex(str(e[1]))
    if tag == "c":
        return complex(float.fromhex(str(e[1])), float.fromhex(str(e[2])))
    if tag == "y":
        return bytes.fromhex(str(e[1]))
    raise ValueError(f"unknown tag {tag!r}")
'''
_codec: dict = {}
exec(CODEC, _codec)
encode, decode, dumps, loads = (_codec[name] for name in ("encode", "decode", "dumps", "loads"))

WORKER_MAIN = r'''
import _socket, os, struct, sys

def read():
    head = b""
    while len(head) < 4:
        chunk = os.read(RFD, 4 - len(head))
        if not chunk:
            os._exit(0)
        head += chunk
    n, body = int.from_bytes(head, "big"), b""
    while len(body) < n:
        chunk = os.read(RFD, n - len(body))
        if not chunk:
            os._exit(0)
        body += chunk
    return loads(body.decode())

def write(obj):
    data = dumps(obj).encode()
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(WFD, data):]

OBJECTS = []

def keep(v):
    OBJECTS.append(v)
    return ["h", len(OBJECTS) - 1]

def builtin_base(cls):
    for c in cls.__mro__:
        if getattr(__builtins__, c.__name__, None) is c:
            return c.__name__
    return "Exception"

def answer(req):
    op = req[0]
    if op == "name":
        return NS[req[1]] if req[1] in NS else MISSING
    obj = OBJECTS[req[1]]
    if op == "call":
        return obj(*[decode(a, OBJECTS.__getitem__) for a in req[2]],
                   **{k: decode(a, OBJECTS.__getitem__) for k, a in req[3].items()})
    if op == "getattr":
        return getattr(obj, req[2])
    if op == "getitem":
        return obj[decode(req[2], OBJECTS.__getitem__)]
    if op == "iter":
        return list(obj)
    if op == "len":
        return len(obj)
    raise ValueError(op)

MISSING = object()

def serve():
    # One test's worker: runs the solution, then answers the judge until it hangs up.
    global NS
    boot = read()
    sys.path[:] = boot["path"]
    NS = {"__name__": "__main__"}
    try:
        exec(compile(boot["solution"], "solution.py", "exec"), NS)
    except BaseException as e:
        write(["raise", builtin_base(type(e)), str(e)[:300]])
        os._exit(1)
    write(["ok"])
    while True:
        req = read()
        try:
            value = answer(req)
            if value is MISSING:
                write(["missing"])
            else:
                write(["value", [encode(x, keep) for x in value] if req[0] == "iter" else encode(value, keep)])
        except BaseException as e:
            write(["raise", builtin_base(type(e)), str(e)[:300]])

# The zygote: for each b"f" on its control socket (fd 3), with a test's two pipe ends, a forked
# worker (its own session); the worker's pid goes back.
CTL = _socket.socket(fileno=3)
CTL.sendall(b"r")
while True:
    try:
        msg, anc, _, _ = CTL.recvmsg(1, _socket.CMSG_SPACE(8))
    except OSError:
        os._exit(0)
    fds = [fd for level, kind, data in anc if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS
           for fd in struct.unpack(f"{len(data) // 4}i", data[:len(data) // 4 * 4])]
    if not msg or len(fds) != 2:
        os._exit(0)
    pid = os.fork()
    if pid == 0:
        CTL.close()
        os.setsid()
        RFD, WFD = fds
        serve()
        os._exit(0)
    for fd in fds:
        os.close(fd)
    CTL.sendall(pid.to_bytes(4, "big"))
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:  # the workers of the tests before, killed by the judge
            pass
    except ChildProcessError:
        pass
'''

ZYGOTE = CODEC + WORKER_MAIN
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
import builtins  # noqa: E402
import select  # noqa: E402
import time  # noqa: E402

P = loads(globals()["PARAMS"])
MAX_REPLY = 16 << 20  # bytes of one answer from the worker; more fails the test


class Abort(BaseException):
    """The worker died, hung or exited: the test fails (never caught by a test's `except`)."""


class TimedOut(Abort):
    """The solution (or its zygote) did not answer within the test's time."""


class NotPlain(TypeError):
    """A test used a value the solution returned that is not plain data as if it were."""


class SolutionRaised(RuntimeError):
    """The solution raised an exception that means control flow, not an error, where the test
    would see it (StopIteration ends a `map` silently): the test gets this failure instead."""


# Re-raised in the test's frame as what they are: everything the solution may raise that is an
# error (ValueError, KeyError, ...). Never these: inside map/filter/zip/starmap or an `async for`
# they end the iteration silently, so `all(map(f, cases))` would pass with nothing checked.
CONTROL_FLOW = ("StopIteration", "StopAsyncIteration")


class TestTimeout(BaseException):
    """A test ran past test_timeout_s (SIGALRM): in its own code, or waiting in a system call."""


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


class Handle:
    """A value that stayed in the worker (not plain data)."""

    __slots__ = ("_worker", "_id")

    def __init__(self, worker: Worker, ident: int) -> None:
        self._worker, self._id = worker, ident

    def __call__(self, *args, **kwargs):
        return value_of(self._worker, ["call", self._id, [to_worker(a) for a in args],
                                       {k: to_worker(v) for k, v in kwargs.items()}])

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return value_of(self._worker, ["getattr", self._id, name])

    def __getitem__(self, key):
        return value_of(self._worker, ["getitem", self._id, to_worker(key)])

    def __iter__(self):
        return iter(value_of(self._worker, ["iter", self._id]))

    def __len__(self) -> int:
        n = value_of(self._worker, ["len", self._id])
        if type(n) is not int:
            raise NotPlain("len() of the solution's object is not an int")
        return n

    def __repr__(self) -> str:
        return "<an object of the solution (not plain data)>"

    def _refuse(self, *_):
        raise NotPlain("a test compared or tested an object of the solution that is not plain data "
                       "(int, float, str, list, dict, ...): only plain values are compared")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __contains__ = _refuse
    __hash__ = __index__ = __int__ = __float__ = __complex__ = _refuse


def to_worker(v) -> list:
    """A test's argument for the worker: plain data (above), or a Handle of its own."""
    def other(x):
        if type(x) is Handle:
            return ["h", x._id]
        raise NotPlain(f"cannot pass a {type(x).__name__} to the solution (plain data only)")
    return encode(v, other)


def from_worker(worker: Worker, e: list):
    """Exact built-in values from the worker's JSON (or Handles): nothing of its types survives."""
    return decode(e, lambda ident: Handle(worker, ident))


def value_of(worker: Worker, req: list, reply: list | None = None):
    """What the worker answered to `req` (asked now unless `reply` is given), as the test sees it."""
    reply = worker.ask(req) if reply is None else reply
    if reply[0] == "value":
        if req[0] == "iter":
            return [from_worker(worker, x) for x in reply[1]]
        return from_worker(worker, reply[1])
    if reply[0] == "raise":
        name = str(reply[1])
        cls = getattr(builtins, name, None)
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            raise Abort(f"the solution raised {name}")  # SystemExit, KeyboardInterrupt, GeneratorExit: a failure
        if name in CONTROL_FLOW:
            raise SolutionRaised(f"the solution raised {name}: {str(reply[2])[:300]}")
        raise cls(str(reply[2])[:300])
    raise Abort(f"an answer the judge does not know: {reply[0]!r}")


class Names(dict):
    """The test's namespace: its own names, then builtins, then the solution's (from the worker)."""

    def __init__(self, worker: Worker) -> None:
        super().__init__(__name__="__main__")
        self.worker = worker

    def __missing__(self, name: str):
        if name in builtins.__dict__:
            raise KeyError(name)  # then Python looks in builtins: the judge's, never the solution's
        reply = self.worker.ask(["name", name])
        if reply[0] == "missing":
            raise KeyError(name)
        value = value_of(self.worker, ["name", name], reply)
        self[name] = value
        return value


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
