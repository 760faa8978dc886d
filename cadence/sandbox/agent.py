"""The process that lives inside a sandbox and runs what the host asks for.

Standard library only: `python -I -S -c LOADER N` reads the agent (N bytes: agent_base.py and
agent_sessions.py, installed under their module names, then this module, run as __main__) from
stdin and runs it, inside bubblewrap (or, in the rlimits-only fallback, directly); the config is
the first frame after it. The host talks to it over the agent's stdin/stdout with length-prefixed frames:
marshal from the host, JSON back (the host never unmarshals what the sandbox wrote). The agent
itself runs no user code: it forks a child per call (a fork of an already-running Python starts in ~1 ms, which is what makes exec fast), applies
the sandbox's rlimits in the child, drops it to user code's uid where the sandbox has one
(isolation.py; not for a `judge` call), and enforces the wall clock from outside. A persistent Python
session (state kept across calls) is one more forked child that stays alive.
"""

# Only modules that import nothing heavy (json, base64, traceback and signal pull in re or enum:
# tens of ms of cold start): marshal for what the host sends, a small JSON writer for replies
# (agent_base).
import _signal as signal
import binascii
import io
import os
import resource
import select
import sys
import time

from cadence.sandbox.agent_base import (
    CFG,
    apply_limits,
    become_user,
    files_as_user,
    high_fds,
    kill_group,
    not_dumpable,
    recv,
    run_code,
    send,
)
from cadence.sandbox.agent_sessions import Session, read_status_line, shell_call

MAX_OUTPUT = 1 << 20  # bytes of stdout/stderr kept per call; the rest is drained and dropped
CODE_ID_ENV = "CADENCE_SANDBOX_CODE_ID"  # a judge's environment: the uid/gid to run user code as
PROTO_IN = PROTO_OUT = -1


def _child_setup(stdin_fd: int, out_fd: int, err_fd: int) -> None:
    os.setsid()
    for target, fd in enumerate(high_fds(stdin_fd, out_fd, err_fd)):
        os.dup2(fd, target)
    os.closerange(3, 1 << 16)
    os.chdir(CFG["workspace"])


def spawn(req: dict) -> tuple[int, int, int, int]:
    """Fork a one-shot child for a command or code; returns pid, stdin, stdout, stderr fds."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            _child_setup(in_r, out_w, err_w)
            apply_limits(req["cpu_s"])
            env = dict(CFG["env"], **(req.get("env") or {}))
            if not req.get("judge"):
                become_user()
            elif CFG.get("code_ids") is not None:  # a judge starts the code it judges as the user
                env[CODE_ID_ENV] = str(CFG["code_ids"])
            if req.get("code") is not None:
                signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C semantics, as in python3
                os.environ.clear()
                os.environ.update(env)
                sys.stdin = io.TextIOWrapper(io.FileIO(0, closefd=False))
                sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
                sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
                os._exit(run_code(req["code"]))
            cmd = req["cmd"]
            argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else cmd
            for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):  # ignored here; not by programs
                signal.signal(sig, signal.SIG_DFL)
            os.execvpe(argv[0], argv, env)
        except BaseException as e:  # exec failed: report like a shell would
            try:
                os.write(2, f"sandbox: {e}\n".encode())
            finally:
                os._exit(127)
    for fd in (in_r, out_w, err_w):
        os.close(fd)
    return pid, in_w, out_r, err_r


def sweep(keep: set[int]) -> None:
    """Kill every process of this sandbox but the agent (and `keep`): what a hung or runaway call
    left behind, fork bombs included. Only where every process we can signal is the sandbox's
    (the agent is pid 1 of its PID namespace, or the sandbox has a uid of its own); otherwise a
    caller kills its child's process group only. In a PID namespace every process is the
    sandbox's, whatever its uid (user code's, or a judge's at the agent's)."""
    if not CFG["sweep_ok"]:
        return
    # kill(-1) reaches every process we may signal, atomically with respect to fork: after the
    # SIGSTOP nothing can fork any more, so the listing below is complete.
    _kill_all(signal.SIGSTOP)
    me, uid = os.getpid(), os.getuid()
    if not keep:
        _kill_all(signal.SIGKILL)
    for pid in keep:
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass
    # Killed processes take a moment to exit (and are reaped by us, pid 1): wait until they are
    # gone, so the next call starts with a clean process table and a free process limit.
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        left = [int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) not in keep
                and int(n) != me and (CFG["isolated"] or _uid_of(n) == uid)]
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _reap()
        time.sleep(0.002)


def _kill_all(sig: int) -> None:
    try:
        os.kill(-1, sig)
    except OSError:  # ESRCH: nothing left to signal
        pass


def _uid_of(pid: str) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1


def _wait(pid: int) -> int:
    """The child's wait status (a SIGKILL status if a sweep already reaped it)."""
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return signal.SIGKILL


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def collect(pid: int, in_fd: int | None, stdin: bytes, out_fd: int, err_fd: int,
            deadline: float, done_fd: int | None = None, done_read=recv) -> dict:
    """Pump stdin/stdout/stderr until the child exits (or, for the session, says done), or the
    deadline passes. Background processes the child left holding its pipes get 0.1 s more to
    write, not until they exit (`server &` must not turn a call into a timeout)."""
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    open_fds = {out_fd, err_fd}
    truncated, done_msg, status, after_exit = False, None, None, None
    if in_fd is not None and not stdin:
        os.close(in_fd)
        in_fd = None
    if in_fd is not None:
        os.set_blocking(in_fd, False)
    while open_fds or in_fd is not None or (done_fd is not None and done_msg is None):
        if done_fd is not None and done_msg is not None:
            break
        if done_fd is None and status is None:
            got, st = os.waitpid(pid, os.WNOHANG)
            if got:
                status, after_exit = st, time.monotonic() + 0.1
        now = time.monotonic()
        if after_exit is not None and now > after_exit:
            break
        left = deadline - now
        if left <= 0:
            return {"timed_out": True, "out": bufs[out_fd], "err": bufs[err_fd], "truncated": truncated}
        watch = list(open_fds) + ([done_fd] if done_fd is not None else [])
        r, w, _ = select.select(watch, [in_fd] if in_fd is not None else [], [], min(left, 0.02))
        if in_fd in w:
            try:
                n = os.write(in_fd, stdin[:65536])
                stdin = stdin[n:]
            except BrokenPipeError:
                stdin = b""
            if not stdin:
                os.close(in_fd)
                in_fd = None
        for fd in r:
            if fd == done_fd:
                done_msg = done_read(done_fd) or {"exit_code": -9, "died": True}
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.discard(fd)
                continue
            room = MAX_OUTPUT - len(bufs[fd])
            truncated |= len(chunk) > room
            bufs[fd] += chunk[:max(room, 0)]
    if done_fd is not None:  # the session flushed before answering: drain what is in the pipes
        for fd in (out_fd, err_fd):
            os.set_blocking(fd, False)
            try:
                while chunk := os.read(fd, 65536):
                    bufs[fd] += chunk[:max(MAX_OUTPUT - len(bufs[fd]), 0)]
            except BlockingIOError:
                pass
            os.set_blocking(fd, True)
    if in_fd is not None:
        os.close(in_fd)
    return {"timed_out": False, "out": bufs[out_fd], "err": bufs[err_fd], "truncated": truncated,
            "done": done_msg, "status": status}


SIGNAL_LIMITS = {signal.SIGXCPU: "cpu", signal.SIGXFSZ: "file_size"}


def status_to_result(status: int, is_code: bool) -> tuple[int, str | None]:
    """Exit code and the limit it shows: killed by SIGXCPU/SIGXFSZ (directly, or a shell's
    128+signal), or, for Python code, a MemoryError (run_code's 137)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return -sig, SIGNAL_LIMITS.get(sig)
    code = os.WEXITSTATUS(status)
    if is_code and code == 137:
        return code, "memory"
    return code, SIGNAL_LIMITS.get(code - 128) if code > 128 else None


SESSIONS: dict[str, Session] = {}  # "python" and "shell", each started on first use


def _session_pids(but: str | None = None) -> set[int]:
    return {s.pid for kind, s in SESSIONS.items() if kind != but}


def do_exec(req: dict) -> dict:
    t0 = time.monotonic()
    deadline = t0 + req["timeout"]
    stdin = (req.get("stdin") or "").encode()
    if req.get("session"):
        kind = "python" if req.get("code") is not None else "shell"
        fresh = kind not in SESSIONS
        if fresh:
            SESSIONS[kind] = Session(shell=kind == "shell")
        s = SESSIONS[kind]
        if s.shell:
            shell_call(s, req)
            res = collect(s.pid, None, b"", s.out, s.err, deadline, done_fd=s.cout, done_read=read_status_line)
        else:
            send(s.cin, {"code": req["code"], "stdin": req.get("stdin"), "cpu_s": req["cpu_s"]})
            res = collect(s.pid, None, b"", s.out, s.err, deadline, done_fd=s.cout)
        if res["timed_out"] or (res.get("done") or {}).get("died"):
            s.close()
            code, limit = status_to_result(_wait(s.pid), not s.shell)
            if res["timed_out"]:
                code, limit = -9, "wall"
            del SESSIONS[kind]
            sweep(_session_pids())
        elif s.shell:  # a shell reports a child killed by signal N as 128 + N
            code, limit = status_to_result(res["done"]["exit_code"] << 8, False)
        else:
            code = res["done"]["exit_code"]
            limit = "memory" if code == 137 else None
        extra = {"session_started": fresh, "session_lost": kind not in SESSIONS}
    else:
        pid, in_w, out_r, err_r = spawn(req)
        res = collect(pid, in_w, stdin, out_r, err_r, deadline)
        if res["timed_out"]:
            kill_group(pid)
            sweep(_session_pids())
        status = res.get("status")
        if status is None:
            status = _wait(pid)
        for fd in (out_r, err_r):
            os.close(fd)
        code, limit = status_to_result(status, req.get("code") is not None)
        if res["timed_out"]:
            code, limit = -9, "wall"
        extra = {}
    return {"exit_code": code, "stdout": res["out"].decode(errors="replace"),
            "stderr": res["err"].decode(errors="replace"), "limit": limit,
            "output_truncated": res["truncated"], "duration_s": time.monotonic() - t0, **extra}


def resolve(path: str) -> str:
    full = os.path.normpath(os.path.join(CFG["workspace"], path))
    if not CFG["isolated"] and os.path.commonpath([full, CFG["workspace"]]) != CFG["workspace"]:
        # Unisolated fallback: the host file system is real, so stay inside the workspace.
        raise PermissionError(f"{path}: outside the workspace")
    return full


def handle(req: dict) -> dict:
    op = req.get("op")
    if op == "ping":
        return {"ok": True}
    if op == "exec":
        return do_exec(req)
    if op == "write":
        full = resolve(req["path"])
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(req["data"])
        if req.get("mode") is not None:
            os.chmod(full, req["mode"])
        return {"ok": True, "path": full}
    if op == "read":
        with open(resolve(req["path"]), "rb") as f:
            data = f.read(req.get("max_bytes", 16 << 20) + 1)
        return {"ok": True, "data": binascii.b2a_base64(data[:req.get("max_bytes", 16 << 20)], newline=False).decode(),
                "truncated": len(data) > req.get("max_bytes", 16 << 20)}
    return {"error": f"unknown op {op!r}"}


def main() -> None:
    global PROTO_IN, PROTO_OUT
    PROTO_IN, PROTO_OUT = high_fds(0, 1)
    CFG.update(recv(PROTO_IN))  # the host sends the config right after the agent's modules
    if CFG["isolated"]:
        not_dumpable()
        files_as_user((CFG["workspace"], "/tmp", "/dev/shm"))
        # pid 1 gets only the signals it handles: Python's SIGINT handler would let code inside
        # end the agent (KeyboardInterrupt). Ignored here, restored in every child.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1):
        os.dup2(null, fd)
    sys.path[:0] = CFG["site_dirs"]  # the host's packages, importable by forked Python children
    os.makedirs(CFG["workspace"], exist_ok=True)
    os.chdir(CFG["workspace"])
    # The agent counts against the process limit too: a sandbox whose processes fill it cannot
    # start the next call (or the health probe) until a sweep, which is what a pool should see.
    nproc = CFG["limits"]["processes"] + CFG["nproc_base"]
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    send(PROTO_OUT, {"ready": True, "pid": os.getpid(), "uid": os.getuid()}, as_json=True)
    while True:
        req = recv(PROTO_IN)
        if req is None:
            for s in SESSIONS.values():
                s.close()
            sweep(set())
            return
        try:
            resp = handle(req)
        except OSError as e:
            resp = {"error": f"{type(e).__name__}: {e.strerror or e}"}
        except Exception as e:  # a malformed request must not take the agent down
            resp = {"error": f"{type(e).__name__}: {e}"}
        _reap()
        resp["id"] = req.get("id")  # the host checks it: a reply is only ever its own call's
        send(PROTO_OUT, resp, as_json=True)


if __name__ == "__main__":
    main()
