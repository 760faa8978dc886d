"""The sandbox agent's shared pieces: frames to and from the host, rlimits, running Python code.

Part of the agent (agent.py), so standard library only and nothing heavy: the host sends these
modules into the sandbox and installs them under their own names (isolation.LOADER).
"""

import _json
import _signal as signal
import fcntl
import marshal
import os
import resource
import struct
import sys

CFG: dict = {}  # the sandbox's config, the first frame from the host (filled in by agent.main)


def to_json(obj) -> str:
    """JSON for the host (which parses replies as JSON: the sandbox is on the untrusted side)."""
    if isinstance(obj, str):
        return _json.encode_basestring_ascii(obj)
    if obj is None or isinstance(obj, bool):
        return {None: "null", True: "true", False: "false"}[obj]
    if isinstance(obj, int | float):
        return repr(obj)
    if isinstance(obj, dict):
        return "{" + ",".join(f"{to_json(str(k))}:{to_json(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, list | tuple):
        return "[" + ",".join(map(to_json, obj)) + "]"
    raise TypeError(f"cannot send {type(obj).__name__}")


def send(fd: int, obj: dict, as_json: bool = False) -> None:
    data = to_json(obj).encode() if as_json else marshal.dumps(obj, 4)
    msg = struct.pack(">I", len(data)) + data
    while msg:
        msg = msg[os.write(fd, msg):]


def recv(fd: int) -> dict | None:
    """A marshal frame: from the host, or between the agent and its session (same sandbox)."""
    head = _read_exact(fd, 4)
    if head is None:
        return None
    body = _read_exact(fd, struct.unpack(">I", head)[0])
    return None if body is None else marshal.loads(body)


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def apply_limits(cpu_s: float | None) -> None:
    """rlimits for a child (never the agent, so a limit hit by user code leaves the agent up)."""
    lim = CFG["limits"]
    pairs = [
        (resource.RLIMIT_AS, lim["memory_mb"] << 20),
        (resource.RLIMIT_NOFILE, lim["open_files"]),
        (resource.RLIMIT_FSIZE, lim["file_size_mb"] << 20),
        (resource.RLIMIT_CORE, 0),
    ]
    # RLIMIT_NPROC counts every process of the real uid: the host gives each sandbox its own uid
    # where it can (nproc_base 0), else the limit comes on top of what the uid already runs.
    pairs.append((resource.RLIMIT_NPROC, lim["processes"] + CFG["nproc_base"]))
    if cpu_s is not None:
        used = resource.getrusage(resource.RUSAGE_SELF)
        base = int(used.ru_utime + used.ru_stime)
        pairs.append((resource.RLIMIT_CPU, (base + int(cpu_s), base + int(cpu_s) + 1)))
    for what, value in pairs:
        resource.setrlimit(what, value if isinstance(value, tuple) else (value, value))


def apply_cpu(cpu_s: float | None) -> None:
    if cpu_s is None:
        return
    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(used.ru_utime + used.ru_stime + cpu_s) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def run_code(code: str) -> int:
    """Run Python source in the current process; returns the exit code a `python -c` would."""
    try:
        exec(compile(code, "<sandbox>", "exec"), SESSION_GLOBALS)
        return 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except MemoryError:
        _print_exc()
        return 137  # reported as a memory limit hit
    except BaseException:
        _print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


SESSION_GLOBALS: dict = {"__name__": "__main__"}


def _print_exc() -> None:
    import traceback  # only on this path: its imports cost more than the rest of the agent

    _, exc, tb = sys.exc_info()
    traceback.print_exception(type(exc), exc, tb.tb_next if tb is not None else None)  # not run_code's frame


PR_SET_DUMPABLE = 4


def libc(name: str):
    """A libc function returning int, through _ctypes, not ctypes: ctypes imports cost
    milliseconds of cold start, _ctypes alone a fraction of one."""
    import _ctypes

    class CInt(_ctypes._SimpleCData):
        _type_ = "i"

    class Func(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL
        _restype_ = CInt

    return Func(_ctypes.dlsym(_ctypes.dlopen(None), name))


def not_dumpable() -> None:
    """Make this process (and every fork of it that does not exec: sessions, `code` calls, a
    unit-test harness) non-dumpable: code of the same uid can then neither ptrace it nor open its
    /proc/PID/mem or /proc/PID/fd (the host pipe)."""
    if libc("prctl")(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError("prctl(PR_SET_DUMPABLE, 0) failed: the agent would be open to ptrace")


def files_as_user(paths: tuple[str, ...]) -> None:
    """Where user code has a uid of its own (CFG["code_ids"]): give it `paths` (its workspace,
    /tmp, /dev/shm), then do every file access of this process, and of its forks, as that uid
    (setfsuid): what the host writes or reads in a sandbox is the user's, and a link planted by
    user code leads nowhere the user could not go itself."""
    ids = CFG.get("code_ids")
    if ids is None:
        return
    for path in paths:
        os.chown(path, ids, ids)
    libc("setfsgid")(ids)
    libc("setfsuid")(ids)
    if libc("setfsuid")(-1) != ids:  # setfsuid reports nothing else
        raise OSError("setfsuid failed: the agent would write the workspace as itself")


def become_user() -> None:
    """Drop this child to user code's uid (where it has one): its capabilities go with uid 0, so
    it can neither signal, ptrace nor read the /proc of the agent or of a judge."""
    ids = CFG.get("code_ids")
    if ids is not None:
        os.setresgid(ids, ids, ids)
        os.setresuid(ids, ids, ids)


def high_fds(*fds: int) -> list[int]:
    """Copies of fds numbered >= 100, so dup2 onto 0..4 cannot clobber one still needed."""
    return [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
