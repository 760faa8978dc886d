"""The unit-test judge: runs inside the sandbox as one `code` call; never runs model code itself.

Sent as source by cadence/rewards/unit_tests.py with `PARAMS` (JSON: the tests, the solution,
the per-test timeout and the call's nonce) defined in front of it. Standard library only.

For each test, a fresh interpreter (the *worker*: exec'd, so it holds none of this process's
memory: no tests, no nonce) runs the solution and then only answers questions: "what is the
name `add`", "call handle 3 with (2, 3)", "attribute `push` of handle 5", "the items of handle
7". The test itself runs here, in the judge, with every name it does not define itself (and that
is not a builtin) looked up in the worker. Answers cross as plain data of exact built-in types
(None, bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset); anything else
stays in the worker behind a `Handle`, which can be called, indexed, iterated, measured (len) and
asked for attributes, but refuses to compare, hash or be truthy. So:

* comparisons (`==`, `<`, `in`, truthiness) are always between built-in values, with built-in
  semantics: an object whose `__eq__` says yes to everything stays a Handle and fails the test;
* the expected values never enter the worker, which sees only the arguments of its calls;
* the worker can lie only about what the solution computed, which is what a solution does;
  exiting, raising SystemExit or KeyboardInterrupt, patching builtins, unittest or pytest, or
  printing, all happen in the worker and fail the test at most;
* the verdict is printed by this process only, on its own stdout (the worker's goes to
  /dev/null and it holds no fd of ours), as `<nonce> <passed>`: the host trusts that line only,
  with the nonce it made for this call, and only when the call exited 0 within its limits.
"""

import builtins
import json
import os
import select
import signal
import struct
import subprocess
import sys
import time

P = json.loads(globals()["PARAMS"])
MAX_REPLY = 16 << 20  # bytes of one answer from the worker; more fails the test

# Plain data of exact built-in types as tagged JSON, both ways: source shared by the judge (exec'd
# here) and the worker (sent as its first lines). Exact types (`type(v) is int`), not isinstance:
# a subclass with its own __eq__ is not plain data.
CODEC = r'''
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
encode, decode = _codec["encode"], _codec["decode"]

WORKER_MAIN = r'''
import json, os, sys
RFD, WFD = int(sys.argv[1]), int(sys.argv[2])

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
    return json.loads(body)

def write(obj):
    data = json.dumps(obj).encode()
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
'''

WORKER = CODEC + WORKER_MAIN


class Abort(BaseException):
    """The worker died, hung or exited: the test fails (never caught by a test's `except`)."""


class NotPlain(TypeError):
    """A test used a value the solution returned that is not plain data as if it were."""


class TestTimeout(BaseException):
    """A test of the judge's own ran past test_timeout_s (SIGALRM)."""


class Worker:
    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        to_r, self.to_w = os.pipe()
        self.from_r, from_w = os.pipe()
        null = subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", WORKER, str(to_r), str(from_w)],
            stdin=null, stdout=null, stderr=null, pass_fds=(to_r, from_w), start_new_session=True)
        os.close(to_r)
        os.close(from_w)

    def ask(self, req: list | dict) -> list:
        data = json.dumps(req).encode()
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
        return json.loads(self._read(n))

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise Abort("the solution did not answer in time")
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
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()


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
        cls = getattr(builtins, str(reply[1]), None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            raise cls(str(reply[2]))
        raise Abort(f"the solution raised {reply[1]}")  # SystemExit, KeyboardInterrupt: a failure
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


def run_test(test: str, index: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    try:
        worker = Worker(deadline)
    except OSError:  # no process left to start (the solution's leftovers fill the limit): a failure
        return False
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)  # a test of its own that loops
    try:
        if worker.ask({"path": sys.path, "solution": P["solution"]})[0] != "ok":
            return False  # the solution itself failed (raised, exited)
        exec(compile(test, f"test_{index}", "exec"), Names(worker))
        return True
    except BaseException:
        return False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        worker.close()


def main() -> None:
    verdict = os.dup(1)  # ours alone: whatever the tests print goes to /dev/null, not before it
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    passed = sum(run_test(test, i, P["timeout_s"]) for i, test in enumerate(P["tests"]))
    os.write(verdict, f"{P['nonce']} {passed}\n".encode())
    os._exit(0)


main()
