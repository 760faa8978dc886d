"""A cgroup per sandbox, where the host lets this process make them: a memory total for the whole
sandbox (all its processes and the files in its tmpfs), a CPU quota (`cpus` cores at once), and
its CPU time, memory and process count for the status API and the pool's CPU budget.

rlimits are per process: without a cgroup, a sandbox can hold `processes x memory_mb`, and a
process that forks before its RLIMIT_CPU runs out hands a fresh CPU count to its child. With a
cgroup, the kernel holds the sandbox to `memory_mb` in all (its OOM killer ends the largest
process of that sandbox only: the agent, being small, survives; a call whose process was killed
so reports `limit="memory"`) and to `cpus` cores whatever it forks. The freezer stops the whole
sandbox while the host reads or writes its workspace (workspace.py).

Supported:
- cgroup v1 with the memory controller, when this process's own memory cgroup is writable (on
  these machines, a firecracker VM as root, it is); the cpu controller (`cpu.cfs_quota_us`) and
  cpuacct (CPU time) and the freezer are added where they are writable too.
- cgroup v2, when this process's own cgroup is writable and delegates the memory controller to
  its children (`cgroup.subtree_control`: a systemd `Delegate=yes` unit, or a container's
  namespace root); `cpu.max` where it delegates cpu too; `cgroup.freeze` (every v2 cgroup has it).
Elsewhere (no root, no delegation) `available()` is False: sandboxes fall back to rlimits, and
the pool measures a sandbox's CPU from /proc instead (`tree_cpu_s`).
"""

from __future__ import annotations

import functools
import os
import signal
import time

PREFIX = "cadence-sandbox-"
FREEZE_TIMEOUT_S = 5.0  # a system call in progress (a long read) finishes well within this
STALE_S = 60.0  # an empty sandbox cgroup older than this was left by a crashed service
CPU_PERIOD_US = 100_000  # the CFS period the quota is a share of (the kernel's default)

# What each version calls the files this module uses: (controller, file name).
V1_FILES = {
    "memory.limit": ("memory", "memory.limit_in_bytes"), "memory.now": ("memory", "memory.usage_in_bytes"),
    "procs": ("memory", "cgroup.procs"), "cpu.quota": ("cpu", "cpu.cfs_quota_us"),
    "cpu.period": ("cpu", "cpu.cfs_period_us"), "cpu.usage": ("cpuacct", "cpuacct.usage"),
    "oom": ("memory", "memory.oom_control"), "freeze": ("freezer", "freezer.state"),
}
V2_FILES = {
    "memory.limit": ("memory", "memory.max"), "memory.now": ("memory", "memory.current"),
    "procs": ("memory", "cgroup.procs"), "cpu.max": ("cpu", "cpu.max"), "cpu.stat": ("cpu", "cpu.stat"),
    "oom": ("memory", "memory.events"), "freeze": ("memory", "cgroup.freeze"), "events": ("memory", "cgroup.events"),
}


def _mounts() -> list[tuple[str, str, str]]:
    """(kind, mount point, options) of every cgroup file system."""
    out = []
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                _, where, kind, opts, *_ = line.split()
                if kind in ("cgroup", "cgroup2"):
                    out.append((kind, where, opts))
    except OSError:
        pass
    return out


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under "" its v2 path."""
    out = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for c in controllers.split(",") if controllers else [""]:
                    out[c] = path
    except OSError:
        pass
    return out


def _writable_dir(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK)


def _v1_parents(mounts: list[tuple[str, str, str]], own: dict[str, str]) -> dict[str, str]:
    by_controller: dict[str, str] = {}
    for kind, where, opts in mounts:
        if kind == "cgroup":
            for opt in opts.split(","):
                by_controller.setdefault(opt, where)
    out = {}
    for controller in ("memory", "cpu", "cpuacct", "freezer"):
        if controller in by_controller and controller in own:
            parent = os.path.join(by_controller[controller], own[controller].lstrip("/"))
            if _writable_dir(parent):
                out[controller] = parent
    return out if "memory" in out else {}


def _v2_parents(mounts: list[tuple[str, str, str]], own: dict[str, str]) -> dict[str, str]:
    where = next((w for kind, w, _ in mounts if kind == "cgroup2"), None)
    if where is None or "" not in own:
        return {}
    parent = os.path.join(where, own[""].lstrip("/"))
    try:
        with open(os.path.join(parent, "cgroup.subtree_control")) as f:
            delegated = f.read().split()
    except OSError:
        return {}
    if "memory" not in delegated or not _writable_dir(parent):
        return {}
    return {c: parent for c in ("memory", "cpu") if c in delegated}


@functools.lru_cache(maxsize=1)
def _layout() -> tuple[int, dict[str, str]]:
    """(cgroup version, writable parent folder per controller) for sandbox cgroups; (0, {}) when
    cgroups cannot be used here. v1 first: on a hybrid host the controllers live there."""
    mounts, own = _mounts(), _own_paths()
    parents = _v1_parents(mounts, own)
    if parents:
        return 1, parents
    parents = _v2_parents(mounts, own)
    return (2, parents) if parents else (0, {})


def available() -> bool:
    return bool(_layout()[1])


def cpu_quota_available() -> bool:
    """Whether sandboxes get a CPU quota (`cpus`) here."""
    return "cpu" in _layout()[1]


class CgroupError(OSError):
    """A cgroup operation the kernel did not complete (the message says which)."""


class SandboxCgroup:
    """The cgroup folders of one sandbox (one per controller under v1, one in all under v2)."""

    def __init__(self, name: str, memory_bytes: int, cpus: float | None = None) -> None:
        self.version, parents = _layout()
        self.files = V1_FILES if self.version == 1 else V2_FILES
        self.dirs = {c: os.path.join(parent, PREFIX + name) for c, parent in parents.items()}
        for d in set(self.dirs.values()):
            os.makedirs(d, exist_ok=True)
        self._write("memory.limit", memory_bytes)
        if cpus is not None and "cpu" in self.dirs:
            quota = max(1000, int(cpus * CPU_PERIOD_US))  # the kernel's smallest quota is 1 ms
            if self.version == 1:
                self._write("cpu.period", CPU_PERIOD_US)
                self._write("cpu.quota", quota)
            else:
                self._write("cpu.max", f"{quota} {CPU_PERIOD_US}")

    @classmethod
    def create(cls, name: str, memory_bytes: int, cpus: float | None = None) -> SandboxCgroup | None:
        """A new cgroup, or None where cgroups are not available (or making one failed)."""
        if not available():
            return None
        try:
            return cls(name, memory_bytes, cpus)
        except OSError:
            return None

    def add_tree(self, pid: int) -> None:
        """Move `pid` and every descendant it has so far. A child forked after its parent moved
        is born inside; one forked before is found below: nothing escapes."""
        todo = [pid]
        while todo:
            p = todo.pop()
            for d in set(self.dirs.values()):
                try:
                    with open(os.path.join(d, "cgroup.procs"), "w") as f:
                        f.write(str(p))
                except OSError:  # ESRCH: it has exited
                    pass
            todo += _children(p)

    def _path(self, key: str) -> str | None:
        controller, name = self.files[key]
        return os.path.join(self.dirs[controller], name) if controller in self.dirs else None

    def _write(self, key: str, value: int | str) -> None:
        with open(self._path(key), "w") as f:
            f.write(str(value))

    def _read(self, key: str) -> str | None:
        path = self._path(key) if key in self.files else None
        if path is None:
            return None
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return None

    def memory_bytes(self) -> int | None:
        raw = self._read("memory.now")
        return int(raw) if raw else None

    def cpu_s(self) -> float | None:
        """CPU seconds used by every process this cgroup ever held."""
        if self.version == 2:
            stat = dict(line.split() for line in (self._read("cpu.stat") or "").splitlines() if " " in line)
            return int(stat["usage_usec"]) / 1e6 if "usage_usec" in stat else None
        raw = self._read("cpu.usage")
        return int(raw) / 1e9 if raw else None

    def cpu_quota(self) -> float | None:
        """The quota in cores, as the kernel holds it (None: no cpu controller, or unlimited)."""
        if self.version == 2:
            quota, _, period = (self._read("cpu.max") or "max").partition(" ")
        else:
            quota, period = self._read("cpu.quota") or "-1", self._read("cpu.period") or "0"
        if quota.strip() in ("max", "-1") or not period.strip():
            return None
        return int(quota) / int(period)

    def processes(self) -> int | None:
        raw = self._read("procs")
        return None if raw is None else len(raw.split())

    def oom_kills(self) -> int:
        """Processes the kernel killed for this cgroup's memory limit so far."""
        for line in (self._read("oom") or "").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def can_freeze(self) -> bool:
        return self._path("freeze") is not None

    def freeze(self, timeout_s: float = FREEZE_TIMEOUT_S) -> None:
        """Freeze every process of the sandbox and return once the kernel reports all of them
        frozen (v2: `cgroup.events` says `frozen 1`; v1: `freezer.state` reads FROZEN, not
        FREEZING). Unlike SIGSTOP, nothing inside can undo it (a SIGCONT does not thaw a cgroup)
        and a process forked meanwhile is born frozen. A process stuck in a long system call
        freezes when it returns; past `timeout_s` the sandbox is thawed and CgroupError raised."""
        v2 = self.version == 2
        self._write("freeze", 1 if v2 else "FROZEN")
        deadline, pause = time.monotonic() + timeout_s, 0.0002
        while True:
            state = self._read("events" if v2 else "freeze") or ""
            if ("frozen 1" in state.splitlines()) if v2 else state.strip() == "FROZEN":
                return
            if time.monotonic() > deadline:
                self.thaw()
                raise CgroupError(f"the sandbox's processes did not freeze within {timeout_s:g} s "
                                  f"(cgroup {self.dirs.get(self.files['freeze'][0])!r} still {state.split()!r})")
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    def thaw(self) -> None:
        """Let the sandbox run again (a frozen process dies of SIGKILL only once thawed); nothing
        when it has no freezer or is gone."""
        if self.can_freeze():
            try:
                self._write("freeze", 0 if self.version == 2 else "THAWED")
            except FileNotFoundError:
                pass

    def kill_all(self) -> None:
        for pid in (self._read("procs") or "").split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass

    def remove(self, wait_s: float = 1.0) -> None:
        """Kill what is left and remove the folders (a process takes a moment to leave)."""
        deadline = time.monotonic() + wait_s
        self.thaw()
        for d in set(self.dirs.values()):
            while True:
                self.kill_all()
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY: not empty yet
                    if time.monotonic() > deadline:
                        break  # left for sweep_stale()
                    time.sleep(0.005)


def sweep_stale() -> int:
    """Remove empty sandbox cgroups a crashed service left behind; returns how many."""
    removed = 0
    for parent in set(_layout()[1].values()):
        try:
            names = [n for n in os.listdir(parent) if n.startswith(PREFIX)]
        except OSError:
            continue
        for name in names:
            path = os.path.join(parent, name)
            try:
                if time.time() - os.stat(path).st_mtime > STALE_S:
                    os.rmdir(path)
                    removed += 1
            except OSError:
                continue
    return removed


def tree_cpu_s(pid: int) -> float | None:
    """CPU seconds of `pid` and its descendants, from /proc: each live process's own time plus
    what it collected from children it reaped (the sandbox's pid 1 reaps every orphan, so a
    process that exited is counted once, in its reaper). The fallback where there is no cgroup;
    None when `pid` is gone."""
    ticks, total, todo, seen = os.sysconf("SC_CLK_TCK"), 0, [pid], 0
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        seen += 1
        total += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
        todo += _children(p)
    return total / ticks if seen else None


def _children(pid: int) -> list[int]:
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    kids = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(k) for k in f.read().split()]
        except OSError:
            continue
    return kids
