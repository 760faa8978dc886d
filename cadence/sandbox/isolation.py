"""How a sandbox process is started: the bubblewrap command line, its uid and its Python.

Inside bwrap the sandbox sees a read-only /usr (with the /lib, /lib64, /bin links), the Python
runtime it runs, a private tmpfs workspace and /tmp, its own /proc and a minimal /dev, and
nothing else of the host: no home, no project checkout, no host /tmp, no network (new user, PID,
IPC, UTS, network and cgroup namespaces). It dies with its parent.

When the host runs as root, each sandbox also gets its own unprivileged host uid (bwrap then runs
unprivileged and maps it to uid 65534 inside). That is what makes RLIMIT_NPROC, which counts all
processes of a real uid, a per-sandbox process limit, and it means no sandbox can signal another.
Without root, the processes limit is added on top of what the user already runs.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import marshal
import os
import random
import shutil
import site
import subprocess
import sys
import warnings
from dataclasses import dataclass, field

from cadence.sandbox.models import IsolationUnavailable, Limits

AGENT_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "agent.py")
SYSTEM_PYTHON = "/usr/bin/python3"
# Reads exactly N bytes of agent source from fd 0 (no buffered reader: it could swallow the config
# frame that follows) and runs it; exits if the host is gone first (an EOF must not spin).
# The agent comes compiled (a marshalled code object, when the sandbox's Python has the host's
# bytecode magic: saves compiling it at every start) or as source.
LOADER = ("import os, sys\nn, src = int(sys.argv[1]), b''\nwhile len(src) < n:\n    chunk = os.read(0, n - len(src))\n"
          "    if not chunk:\n        sys.exit(1)  # the host went away before sending it\n    src += chunk\n"
          "if sys.argv[2] == 'code':\n    import marshal\n    src = marshal.loads(src)\n"
          "else:\n    src = compile(src, 'cadence-sandbox-agent', 'exec')\nexec(src)")
WORKSPACE = "/workspace"
UID_RANGE = (2_000_000, 3_000_000)  # host uids handed to sandboxes when the host runs as root

UNISOLATED_WARNING = (
    "WARNING: sandbox started WITHOUT isolation (bubblewrap missing, allow_unisolated=True): "
    "rlimits only; the code it runs can read and write your files and use the network"
)


@dataclass
class Launch:
    """Everything subprocess.Popen needs to start one sandbox's agent."""

    argv: list[str]
    user: int | None
    isolated: bool
    preamble: bytes  # written to the agent's stdin first: its own source (see LOADER)
    config: dict
    workspace_host: str | None = None  # the unisolated fallback's host folder
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Runtime:
    executable: str
    prefixes: tuple[str, ...]
    site_dirs: tuple[str, ...]
    magic: str  # bytecode magic number (hex)


@functools.lru_cache(maxsize=8)
def python_runtime(python: str | None = None) -> Runtime:
    """The interpreter sandboxes run and the folders it needs (prefix, venv, site-packages)."""
    if python is None or os.path.realpath(python) == os.path.realpath(sys.executable):
        exe, prefixes, sites = sys.executable, {sys.prefix, sys.base_prefix}, site.getsitepackages()
        magic = importlib.util.MAGIC_NUMBER.hex()
    else:
        exe = shutil.which(python) or python
        probe = ("import importlib.util,json,site,sys;print(json.dumps([sys.prefix,sys.base_prefix,"
                 "site.getsitepackages(),importlib.util.MAGIC_NUMBER.hex()]))")
        try:
            out = subprocess.run([exe, "-c", probe], capture_output=True, text=True, timeout=30, check=True)
        except (OSError, subprocess.SubprocessError) as e:
            raise IsolationUnavailable(f"python={python}: cannot run it ({e}); give a working interpreter") from e
        prefix, base, sites, magic = json.loads(out.stdout)
        prefixes = {prefix, base}
    prefixes.add(os.path.dirname(os.path.dirname(os.path.realpath(exe))))
    return Runtime(exe, tuple(sorted(prefixes)), tuple(s for s in sites if os.path.isdir(s)), magic)


def _others_can_use(path: str) -> bool:
    """Whether an unprivileged uid can reach `path` (every parent folder o+x, the path o+r)."""
    path = os.path.realpath(path)
    parts = path.split("/")
    for i in range(2, len(parts)):
        if not os.stat("/".join(parts[:i])).st_mode & 0o001:
            return False
    return bool(os.stat(path).st_mode & 0o004)


def sandbox_python(python: str | None, switching_uid: bool) -> Runtime:
    """The interpreter a sandbox runs: the caller's choice, else the one running cadence. A
    sandbox with its own uid cannot reach an interpreter under a private folder (a pyenv in
    /root): then the system's /usr/bin/python3, which has the standard library only."""
    rt = python_runtime(python)
    if not switching_uid or all(_others_can_use(p) for p in (rt.executable, *rt.prefixes)):
        return rt
    if python is None and os.path.exists(SYSTEM_PYTHON):
        return python_runtime(SYSTEM_PYTHON)
    raise IsolationUnavailable(
        f"python={rt.executable}: sandboxes run as an unprivileged uid that cannot read it "
        f"(a parent folder is not world-readable); give python={SYSTEM_PYTHON} or a readable interpreter"
    )


@functools.lru_cache(maxsize=2)
def _agent_payload(magic: str) -> tuple[bytes, str]:
    """The agent for a sandbox Python with this bytecode magic: compiled if it is ours."""
    with open(AGENT_SRC, "rb") as f:  # sent over stdin: no host path to bind or to reach
        src = f.read()
    if magic == importlib.util.MAGIC_NUMBER.hex():
        return marshal.dumps(compile(src, "cadence-sandbox-agent", "exec")), "code"
    return src, "source"


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def _system_view() -> list[str]:
    """Read-only /usr and what merged-/usr systems link into it; a few files ld.so and /usr/bin
    links need from /etc."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/lib", "/lib64", "/lib32", "/bin", "/sbin"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for path in ("/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime"):
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def _host_uid() -> int | None:
    return random.randrange(*UID_RANGE) if os.geteuid() == 0 else None


def _nproc_base(uid: int | None) -> int:
    """Processes the sandbox's real uid already has (0 for a fresh uid)."""
    if uid is not None:
        return 0
    me = os.getuid()
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                count += os.stat(f"/proc/{name}").st_uid == me
            except OSError:
                pass
    return count + 16


def launch(limits: Limits, python: str | None = None, allow_unisolated: bool = False) -> Launch:
    """The command that starts one sandbox agent, isolated by bwrap (or, with the opt-in, not)."""
    uid = _host_uid()
    rt = sandbox_python(python, uid is not None)
    bwrap = bwrap_path()
    agent, kind = _agent_payload(rt.magic)
    loader = ["-I", "-S", "-c", LOADER, str(len(agent)), kind]
    if bwrap is None and not allow_unisolated:
        raise IsolationUnavailable(
            "bubblewrap (bwrap) is not installed: install it (apt-get install bubblewrap), or pass "
            "allow_unisolated=True / --allow-unisolated for an rlimits-only sandbox without isolation"
        )
    cfg = {
        "limits": limits.model_dump(),
        "site_dirs": list(rt.site_dirs),
        "nproc_base": _nproc_base(uid),
        "env": {
            "PATH": ":".join([os.path.dirname(rt.executable), "/usr/local/bin", "/usr/bin", "/bin"]),
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
            "PYTHONUNBUFFERED": "1",
        },
    }
    if bwrap is None:
        warnings.warn(UNISOLATED_WARNING, stacklevel=3)
        print(UNISOLATED_WARNING, file=sys.stderr, flush=True)
        import tempfile

        ws = tempfile.mkdtemp(prefix="cadence-sandbox-")
        if uid is not None:
            os.chown(ws, uid, uid)
        cfg.update(workspace=ws, sweep_ok=uid is not None, isolated=False)
        cfg["env"].update(HOME=ws)
        argv = [rt.executable, *loader]
        return Launch(argv, uid, isolated=False, preamble=agent, config=cfg, workspace_host=ws)
    cfg.update(workspace=WORKSPACE, sweep_ok=True, isolated=True)
    cfg["env"].update(HOME=WORKSPACE)
    size = str(limits.disk_mb << 20)
    argv = [
        bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--as-pid-1",
        "--uid", "65534", "--gid", "65534", "--hostname", "sandbox", "--clearenv",
        *_system_view(),
    ]
    for prefix in rt.prefixes:
        if not prefix.startswith("/usr/") and prefix != "/usr":
            argv += ["--ro-bind", prefix, prefix]
    argv += [
        "--proc", "/proc", "--dev", "/dev",
        "--size", size, "--tmpfs", "/tmp",
        "--size", size, "--tmpfs", WORKSPACE,
        "--chdir", WORKSPACE,
        rt.executable, *loader,
    ]
    return Launch(argv, uid, isolated=True, preamble=agent, config=cfg)
