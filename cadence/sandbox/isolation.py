"""How a sandbox process is started: the bubblewrap command line, its uid and its Python.

Inside bwrap the sandbox sees a read-only /usr (with the /lib, /lib64, /bin links), the Python
runtime it runs (its installation read-only at /opt/python unless it lives under /usr; its
site-packages importable with python_packages="site", the default, covered up with "none"),
the code a hosted environment needs (one package or one file, read-only under /opt/code), a
private tmpfs workspace and /tmp, its own /proc and a minimal /dev, and nothing else of the
host: no home, no project checkout, no host /tmp, no network (new user, PID, IPC, UTS, network
and cgroup namespaces). It dies with its parent.

When the host runs as root, each sandbox also gets two unprivileged host uids of its own: one for
its agent (uid 0 inside, with CAP_SETUID, CAP_SETGID, CAP_KILL and CAP_CHOWN in the sandbox's user
namespace only) and one for the code it runs (uid 65534 inside, no capabilities). bwrap runs as
the agent's uid and waits (--userns-block-fd) while this host, as root, writes the two-line uid
and gid maps bwrap alone could not (a user namespace maps one uid without a privileged helper):
see write_id_maps. So user code can neither signal, ptrace nor read the /proc of the agent or of
a judge the agent runs at its own uid (`judge=True` calls), whatever the seccomp filter allows;
RLIMIT_NPROC, which counts all processes of a real uid, is a per-sandbox process limit, and no
sandbox can signal another. Without root there is one uid (65534 inside), the processes limit
comes on top of what the user already runs, and what keeps user code from the agent is the
filter and non-dumpability. A uid of its own cannot read an interpreter under a private folder
(a pyenv in /root): such folders are staged for bwrap by staging.py, without changing the
host's permissions.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import importlib.util
import json
import marshal
import os
import platform
import random
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass, field

from cadence.sandbox import seccomp, staging
from cadence.sandbox.models import IsolationUnavailable, Limits
from cadence.sandbox.system_view import system_view
from cadence.sandbox.template_root import MOUNTS_AT, TemplateRoot, mount_ops
from cadence.sandbox.templates import Template

SANDBOX_DIR = os.path.dirname(os.path.abspath(__file__))
# The agent's modules, dependencies first; the last one runs as __main__ (see agent.py).
AGENT_MODULES = ("agent_base", "agent_sessions", "agent")
# Reads exactly N bytes of agent from fd 0 (no buffered reader: it could swallow the config frame
# that follows) and runs it; exits if the host is gone first (an EOF must not spin). The agent is
# a marshalled list of (module name, code): compiled code objects when the sandbox's Python has
# the host's bytecode magic (saves compiling at every start), else source. Every module but the
# last is installed under its name in sys.modules, so their imports of each other just work.
LOADER = ("import os, sys\nn, src = int(sys.argv[1]), b''\nwhile len(src) < n:\n    chunk = os.read(0, n - len(src))\n"
          "    if not chunk:\n        sys.exit(1)  # the host went away before sending it\n    src += chunk\n"
          "import marshal\n*_deps, (_n, _main) = marshal.loads(src)\n"
          "def _code(part):\n    return compile(part, 'cadence-sandbox-agent', 'exec') if isinstance(part, bytes) else part\n"
          "for _n, _part in _deps:\n    _m = sys.modules[_n] = type(sys)(_n)\n    exec(_code(_part), _m.__dict__)\n"
          "exec(_code(_main))")
WORKSPACE = "/workspace"
SYSTEM_PYTHON = "/usr/bin/python3"  # the unisolated fallback's interpreter when ours is private
# Neutral paths inside a sandbox for what it is shown of the host beyond /usr (read-only).
PYTHON_HOME = "/opt/python"  # the interpreter's installation
SITE_ROOT = "/opt/site"  # site-packages outside it beyond a venv's first
VENV_ROOT = "/opt/venv"  # a venv: its pyvenv.cfg and bin/python3 (made here), its site-packages
CODE_ROOT = "/opt/code"  # code a hosted environment needs (one package or one file)
PYTHON_PACKAGES = ("site", "none")
UID_RANGE = (2_000_000, 3_000_000)  # host uids handed to sandboxes when the host runs as root
CODE_ID = 65534  # uid and gid of user code inside (and of everything, without a second uid)
# What the agent may do in its own user namespace when user code has a uid of its own: drop its
# children to that uid, signal them, and give them the workspace. Nothing of the host's.
AGENT_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_CHOWN")

UNISOLATED_WARNING = (
    "WARNING: sandbox started WITHOUT isolation (bubblewrap missing, allow_unisolated=True): "
    "rlimits only; the code it runs can read and write your files and use the network"
)


@dataclass
class Launch:
    """Everything subprocess.Popen needs to start one sandbox's agent."""

    argv: list[str]
    user: int | None  # the agent's host uid (None: this process's)
    isolated: bool
    preamble: bytes  # written to the agent's stdin first: the agent itself (see LOADER)
    config: dict
    workspace_host: str | None = None  # the unisolated fallback's host folder
    env: dict[str, str] = field(default_factory=dict)
    stage: list[str] = field(default_factory=list)  # host paths to stage first (staging.py)
    seccomp: bytes | None = None  # the filter bwrap loads (seccomp.py); argv_with() adds its fd
    root: TemplateRoot | None = None  # a template's copy-on-write root, mounted by the spawner
    code_uid: int | None = None  # user code's host uid, when it has one of its own (write_id_maps)

    def argv_with(self, seccomp_fd: int | None, info_fd: int | None = None, block_fd: int | None = None) -> list[str]:
        """The argv, with `--seccomp FD` for bwrap when there is a filter to load, and with
        `--info-fd`/`--userns-block-fd` when this host writes the id maps (code_uid)."""
        extra = [] if seccomp_fd is None else ["--seccomp", str(seccomp_fd)]
        if info_fd is not None and block_fd is not None:
            extra += ["--info-fd", str(info_fd), "--userns-block-fd", str(block_fd)]
        return [self.argv[0], *extra, *self.argv[1:]]


@dataclass(frozen=True)
class Mount:
    """A host file or folder shown read-only inside a sandbox at `inside` (under CODE_ROOT)."""

    host: str
    inside: str

    def __post_init__(self) -> None:
        if os.path.commonpath([self.inside, CODE_ROOT]) != CODE_ROOT or ".." in self.inside.split("/"):
            raise ValueError(f"mount {self.inside!r}: must be under {CODE_ROOT}")


@dataclass(frozen=True)
class Runtime:
    executable: str  # the real interpreter binary (symlinks and venvs resolved)
    prefix: str  # the installation it belongs to: its standard library is under prefix/lib
    site_dirs: tuple[str, ...]
    magic: str  # bytecode magic number (hex)
    venv: bool = False  # a virtualenv's interpreter (its site-packages outside prefix)


@functools.lru_cache(maxsize=8)
def python_runtime(python: str | None = None) -> Runtime:
    """The interpreter sandboxes run, its installation and its site-packages (a venv's too)."""
    # Not realpath: a venv's python is a link to its base's, and the venv's packages would be lost.
    if python is None or os.path.abspath(shutil.which(python) or python) == os.path.abspath(sys.executable):
        exe, base, sites = sys.executable, sys.base_prefix, site.getsitepackages()
        magic, venv = importlib.util.MAGIC_NUMBER.hex(), sys.prefix != sys.base_prefix
    else:
        exe = shutil.which(python) or python
        probe = ("import importlib.util,json,site,sys;print(json.dumps([sys.base_prefix,"
                 "site.getsitepackages(),importlib.util.MAGIC_NUMBER.hex(),sys.prefix!=sys.base_prefix]))")
        try:
            out = subprocess.run([exe, "-c", probe], capture_output=True, text=True, timeout=30, check=True)
        except (OSError, subprocess.SubprocessError) as e:
            raise IsolationUnavailable(f"python={python}: cannot run it ({e}); give a working interpreter") from e
        base, sites, magic, venv = json.loads(out.stdout)
    real = os.path.realpath(exe)
    prefix = os.path.realpath(base)
    if not _under(real, prefix):  # e.g. a venv whose python is a copy: its own bin/ holds it
        prefix = os.path.dirname(os.path.dirname(real))
    return Runtime(real, prefix, tuple(s for s in sites if os.path.isdir(s)), magic, venv)


def _under(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


def _others_can_use(path: str) -> bool:
    """Whether an unprivileged uid can reach `path` (every parent folder o+x, the path o+r)."""
    path = os.path.realpath(path)
    parts = path.split("/")
    for i in range(2, len(parts)):
        if not os.stat("/".join(parts[:i])).st_mode & 0o001:
            return False
    return bool(os.stat(path).st_mode & 0o004)


@dataclass
class PythonView:
    """How a runtime appears inside a sandbox: what to bind where, and the paths seen inside."""

    binds: list[tuple[str, str]]  # (host, inside), read-only
    hidden: list[str]  # inside paths covered by an empty tmpfs
    executable: str
    site_dirs: list[str]
    env: dict[str, str]


def python_view(rt: Runtime, packages: str) -> PythonView:
    """The interpreter's installation read-only at PYTHON_HOME (a neutral path: no host home or
    checkout path inside), or where it is when it lives under /usr (already visible). With
    packages="site" its site-packages are importable; with "none" only the standard library is:
    the site-packages folders are covered up. A venv's interpreter is a venv inside too, at
    VENV_ROOT (a pyvenv.cfg pointing at the base, its site-packages bound in): so `python3`
    and `sys.executable -I` started by code find the venv's packages, as they do on the host."""
    binds: list[tuple[str, str]] = []
    env: dict[str, str] = {}
    if _under(rt.prefix, "/usr"):
        def inside(p: str) -> str:
            return p
    else:
        binds.append((rt.prefix, PYTHON_HOME))

        def inside(p: str) -> str:
            return PYTHON_HOME + p[len(rt.prefix):]
        lib = os.path.join(rt.prefix, "lib")
        if os.path.isdir(lib) and any(n.startswith("libpython") for n in os.listdir(lib)):
            env["LD_LIBRARY_PATH"] = inside(lib)  # its RUNPATH is the host path
    executable = inside(rt.executable)
    site_dirs, hidden, extra = [], [], []
    for d in rt.site_dirs:
        seen = inside(d) if _under(d, rt.prefix) else d if _under(d, "/usr") else None
        if packages == "none":
            if seen is not None:
                hidden.append(seen)
            continue
        if seen is None and rt.venv and executable == inside(rt.executable):  # the venv's own
            pyver = os.path.basename(os.path.dirname(d))  # lib/python3.X/site-packages
            seen = f"{VENV_ROOT}/lib/{pyver}/site-packages"
            binds += [(_venv_skeleton(executable, pyver), VENV_ROOT), (d, seen)]
            executable = f"{VENV_ROOT}/bin/python3"
        elif seen is None:
            seen = f"{SITE_ROOT}/{len(extra)}"
            binds.append((d, seen))
            extra.append(seen)
        site_dirs.append(seen)
    if extra:  # further site folders, for `python3` run as a command too
        env["PYTHONPATH"] = ":".join(extra)
    if not _under(rt.prefix, "/usr"):  # a venv's base packages stay out of `python3` commands too
        for d in sorted(glob.glob(os.path.join(rt.prefix, "lib", "python3*", "site-packages"))):
            if d not in rt.site_dirs and inside(d) not in hidden:
                hidden.append(inside(d))
    return PythonView(binds, hidden, executable, site_dirs, env)


def _venv_skeleton(base_executable: str, pyver: str) -> str:
    """A host folder shown at VENV_ROOT: pyvenv.cfg naming the base interpreter's folder inside
    the sandbox, bin/python3 linking to it, and an empty site-packages (a mount point). Made once
    per (interpreter, version), in staging.VIEWS (ours, writable by nobody else)."""
    name = "venv-" + hashlib.sha256(f"{base_executable}:{pyver}".encode()).hexdigest()[:16]
    folder = os.path.join(staging.root(staging.VIEWS), name)
    if os.path.isdir(folder):
        return folder
    tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=staging.root(staging.VIEWS))
    os.makedirs(os.path.join(tmp, "bin"))
    os.makedirs(os.path.join(tmp, "lib", pyver, "site-packages"))
    with open(os.path.join(tmp, "pyvenv.cfg"), "w") as f:
        f.write(f"home = {os.path.dirname(base_executable)}\ninclude-system-site-packages = false\n")
    for link in ("python3", "python"):
        os.symlink(base_executable, os.path.join(tmp, "bin", link))  # resolved inside the sandbox
    for dirpath, _, _ in os.walk(tmp):
        os.chmod(dirpath, 0o755)  # mkdtemp made it 0700: the sandbox's own uid walks through it
    os.chmod(os.path.join(tmp, "pyvenv.cfg"), 0o644)
    try:
        os.rename(tmp, folder)
    except OSError:  # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


@functools.lru_cache(maxsize=2)
def _agent_payload(magic: str) -> bytes:
    """The agent for a sandbox Python with this bytecode magic: compiled if it is ours. Sent over
    stdin: no host path to bind or to reach."""
    parts = []
    for name in AGENT_MODULES:
        with open(os.path.join(SANDBOX_DIR, f"{name}.py"), "rb") as f:
            src = f.read()
        same = magic == importlib.util.MAGIC_NUMBER.hex()
        parts.append((f"cadence.sandbox.{name}", compile(src, f"cadence-sandbox-{name}", "exec") if same else src))
    return marshal.dumps(parts, 4)


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def _host_uids() -> tuple[int | None, int | None]:
    """The agent's and user code's host uids: a fresh pair (uid, uid + 1) as root, else none."""
    if os.geteuid() != 0:
        return None, None
    agent = random.randrange(*UID_RANGE) & ~1
    return agent, agent + 1


def reap_orphans() -> int:
    """Kill what sandboxes of a dead service left running; returns how many processes.

    Every process of a live sandbox has a parent in it (its outer bwrap, or the agent), so a
    process of a sandbox uid (UID_RANGE) whose parent is init belongs to no sandbox anyone can
    reach. bwrap leaves one when its outer process is killed (its service died) in the moment
    between starting its child and signalling it: the child, before --die-with-parent applies
    to it, then waits for that signal for ever."""
    if os.geteuid() != 0:
        return 0
    reaped = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            uid = os.stat(f"/proc/{name}").st_uid
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if UID_RANGE[0] <= uid < UID_RANGE[1] and ppid == 1:
            try:
                os.kill(int(name), signal.SIGKILL)
                reaped += 1
            except ProcessLookupError:
                pass
    return reaped


def write_id_maps(child_pid: int, agent_uid: int, code_uid: int) -> None:
    """Map the sandbox's two uids (and gids) into bwrap's new user namespace: the agent's host uid
    to 0 inside, user code's to CODE_ID. Written by this host as root (CAP_SETUID in the parent
    namespace), while bwrap waits on --userns-block-fd."""
    lines = f"0 {agent_uid} 1\n{CODE_ID} {code_uid} 1\n"
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{child_pid}/{name}", "w") as f:
            f.write(lines)


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


def _bind_source(path: str, switching_uid: bool, stage: list[str]) -> str:
    """The path bwrap binds for host `path`: itself, or, when the sandbox's own uid cannot reach
    it (a private folder, e.g. a pyenv in /root), its staged mount point (staging.py)."""
    if not switching_uid or _others_can_use(path):
        return path
    stage.append(path)
    return staging.staged_path(path)


def _unisolated_runtime(rt: Runtime, python: str | None, switching_uid: bool) -> Runtime:
    """Without bwrap nothing can be staged: an interpreter the sandbox's uid cannot read (a pyenv
    in /root) is replaced by the system's, which has the standard library only."""
    if not switching_uid or all(_others_can_use(p) for p in (rt.executable, rt.prefix)):
        return rt
    if python is None and os.path.exists(SYSTEM_PYTHON):
        return python_runtime(SYSTEM_PYTHON)
    raise IsolationUnavailable(
        f"python={rt.executable}: the unisolated sandbox's uid cannot read it (a parent folder is "
        f"private); give python={SYSTEM_PYTHON} or a readable interpreter, or install bubblewrap")


def _open_parents(argv: list[str]) -> list[str]:
    """bwrap makes the missing parent folders of a mount point (/etc for /etc/ld.so.cache, /opt
    for /opt/python) mode 0700, owned by its uid inside: user code under a uid of its own could
    not walk through them. So each is made first, 0755 (`--perms 0755 --dir`)."""
    start = argv.index("--clearenv") + 1
    places = [args[MOUNTS_AT[opt]] for opt, args in mount_ops(argv, start)]
    parents: list[str] = []
    for place in places:
        parts = place.strip("/").split("/")
        for k in range(1, len(parts)):
            parent = "/" + "/".join(parts[:k])
            inside_a_mount = any(parent == p or parent.startswith(p.rstrip("/") + "/") for p in places)
            if not inside_a_mount and parent not in parents:
                parents.append(parent)
    made = [arg for parent in parents for arg in ("--perms", "0755", "--dir", parent)]
    return argv[:start] + made + argv[start:]


def launch(limits: Limits, python: str | None = None, allow_unisolated: bool = False,
           python_packages: str = "site", mounts: tuple[Mount, ...] = (), dev_tools: bool = False,
           template: Template | None = None) -> Launch:
    """The command that starts one sandbox agent, isolated by bwrap (or, with the opt-in, not).
    `dev_tools`: show /usr whole, debuggers and compilers included (system_view.py). `template`:
    the root file system is the template's, under a copy-on-write layer (template_root.py); one
    with its own system runs its own python3 and shows nothing of the host's /usr."""
    if python_packages not in PYTHON_PACKAGES:
        raise ValueError(f"python_packages={python_packages!r}: use one of {PYTHON_PACKAGES}")
    uid, code_uid = _host_uids()
    rt = python_runtime(python)
    bwrap = bwrap_path()
    if bwrap is None and not allow_unisolated:
        raise IsolationUnavailable(
            "bubblewrap (bwrap) is not installed: install it (apt-get install bubblewrap), or pass "
            "allow_unisolated=True / --allow-unisolated for an rlimits-only sandbox without isolation"
        )
    if bwrap is None and template is not None:
        raise IsolationUnavailable(f"template {template.name!r}: a sandbox on a template needs bubblewrap")
    if bwrap is None:
        rt = _unisolated_runtime(rt, python, uid is not None)
    own = template is not None and template.own_system
    agent = _agent_payload(template.magic if own else rt.magic)
    loader = ["-I", "-S", "-c", LOADER, str(len(agent))]
    # Unisolated, the host's own paths are what the agent sees.
    view = PythonView([], [], template.python, list(template.site_dirs), {}) if own else (
        python_view(rt, python_packages)) if bwrap else PythonView(
        [], [], rt.executable, list(rt.site_dirs) if python_packages == "site" else [], {})
    cfg = {
        "limits": limits.model_dump(),
        "site_dirs": view.site_dirs,
        "nproc_base": _nproc_base(uid),
        "env": {
            "PATH": ":".join([os.path.dirname(view.executable), "/usr/local/bin", "/usr/bin", "/bin"]),
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
            "PYTHONUNBUFFERED": "1",
            **view.env,
        },
    }
    if bwrap is None:
        warnings.warn(UNISOLATED_WARNING, stacklevel=3)
        print(UNISOLATED_WARNING, file=sys.stderr, flush=True)

        ws = tempfile.mkdtemp(prefix="cadence-sandbox-")
        if uid is not None:
            os.chown(ws, uid, uid)
        cfg.update(workspace=ws, sweep_ok=uid is not None, isolated=False, code_ids=None)
        cfg["env"].update(HOME=ws)
        argv = [rt.executable, *loader]
        return Launch(argv, uid, isolated=False, preamble=agent, config=cfg, workspace_host=ws)
    # With a uid for user code, the agent is uid 0 inside (its children drop to CODE_ID); else
    # everything runs as CODE_ID.
    cfg.update(workspace=WORKSPACE, sweep_ok=True, isolated=True, code_ids=None if code_uid is None else CODE_ID)
    cfg["env"].update(HOME=WORKSPACE)
    size = str(limits.disk_mb << 20)
    agent_id = CODE_ID if code_uid is None else 0
    argv = [
        bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--as-pid-1",
        "--uid", str(agent_id), "--gid", str(agent_id), "--hostname", "sandbox", "--clearenv",
    ]
    if code_uid is not None:
        for cap in AGENT_CAPS:
            argv += ["--cap-add", cap]
    # The root folder of a template belongs to whoever writes there: user code.
    root = (TemplateRoot.for_sandbox(template, limits.disk_mb, code_uid if code_uid is not None else uid)
            if template is not None else None)
    if root is not None:
        argv += ["--bind", root.merged, "/"]  # first: everything below mounts over it
    if not own:
        argv += system_view(dev_tools, keep=(rt.executable,))
    stage: list[str] = []
    for host, inside in [*view.binds, *((m.host, m.inside) for m in mounts)]:
        argv += ["--ro-bind", _bind_source(host, uid is not None, stage), inside]
    for inside in view.hidden:
        argv += ["--tmpfs", inside]
    for name, value in view.env.items():  # the agent's own interpreter needs LD_LIBRARY_PATH
        argv += ["--setenv", name, value]
    argv += [
        "--proc", "/proc", "--dev", "/dev",
        "--size", size, "--tmpfs", "/dev/shm",  # else --dev's own /dev/shm: a tmpfs without a size
        "--size", size, "--tmpfs", "/tmp",
        "--size", size, "--tmpfs", WORKSPACE,
        # The root itself read-only (/opt, the mount points): only /workspace and /tmp are writable;
        # on a template, its copy-on-write layer takes writes too.
        *(["--remount-ro", "/"] if root is None else []),
        "--chdir", WORKSPACE,
        view.executable, *loader,
    ]
    if root is None:
        argv = _open_parents(argv)
    prog = seccomp.program()
    if prog is None:
        raise IsolationUnavailable(f"no seccomp syscall table for {platform.machine()} "
                                   f"(known: {sorted(seccomp.TABLES)}); add one to cadence/sandbox/seccomp.py")
    return Launch(argv, uid, isolated=True, preamble=agent, config=cfg, stage=stage, seccomp=prog, root=root,
                  code_uid=code_uid)
