"""The program of the user's processes, after codec.py: a zygote that forks one worker per test.
Runs as user code (the judge starts it: judge/workers.py), with nothing of the judge's but its
control socket (fd 3). A worker runs the solution, then answers the judge's questions ("the name
`add`", "call handle 3 with (2, 3)") in plain data, keeping anything else behind a handle.
Not a module to import: run as the zygote's whole program (`python -I -S -c`)."""

import _socket
import os
import struct
import sys

if False:  # what the program defines before this part (judge/__init__.py); for readers and linters
    from cadence.rewards.judge.codec import decode, dumps, encode, loads


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
