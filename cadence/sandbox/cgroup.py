"""A cgroup per sandbox, where the host lets this process make them: a memory total for the whole
sandbox (all its processes and the files in its tmpfs), and its CPU time, memory and process
count for the status API.

rlimits are per process: without a cgroup, a sandbox can hold `processes x memory_mb`. With one,
the kernel holds the sandbox to `memory_mb` in all, and its OOM killer ends the largest process
of that sandbox only (the agent, being small, survives; a call whose process was killed so
reports `limit="memory"`).

Supported: cgroup v1 with the memory controller (and cpuacct, for CPU time), when this process's
own memory cgroup is writable: on these machines (a firecracker VM, root) it is. Under cgroup v2
a sandbox would need the memory controller delegated to this process's subtree; that is not
implemented, and there (as without root) sandboxes fall back to rlimits alone, which
`available()` tells.
"""

from __future__ import annotations

import functools
import os
import signal
import time

PREFIX = "cadence-sandbox-"
STALE_S = 60.0  # an empty sandbox cgroup older than this was left by a crashed service


def _v1_mounts() -> dict[str, str]:
    """cgroup v1 controller -> mount point."""
    out = {}
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                _, where, kind, opts, *_ = line.split()
                if kind == "cgroup":
                    for opt in opts.split(","):
                        out.setdefault(opt, where)
    except OSError:
        pass
    return out


def _own_path(controller: str) -> str | None:
    """This process's cgroup path in `controller`'s v1 hierarchy."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controller in controllers.split(","):
                    return path
    except OSError:
        pass
    return None


@functools.lru_cache(maxsize=1)
def _parents() -> dict[str, str]:
    """Writable parent folders for sandbox cgroups: {"memory": ..., "cpuacct": ...} (memory is
    required; cpuacct only adds CPU time). Empty when cgroups cannot be used here."""
    mounts, out = _v1_mounts(), {}
    for controller in ("memory", "cpuacct"):
        own = _own_path(controller)
        if controller not in mounts or own is None:
            continue
        parent = os.path.join(mounts[controller], own.lstrip("/"))
        if os.path.isdir(parent) and os.access(parent, os.W_OK):
            out[controller] = parent
    return out if "memory" in out else {}


def available() -> bool:
    return bool(_parents())


class SandboxCgroup:
    """The cgroup folders of one sandbox (one per controller)."""

    def __init__(self, name: str, memory_bytes: int) -> None:
        self.dirs = {c: os.path.join(parent, PREFIX + name) for c, parent in _parents().items()}
        for d in self.dirs.values():
            os.makedirs(d, exist_ok=True)
        self._write("memory", "memory.limit_in_bytes", memory_bytes)

    @classmethod
    def create(cls, name: str, memory_bytes: int) -> SandboxCgroup | None:
        """A new cgroup, or None where cgroups are not available (or making one failed)."""
        if not available():
            return None
        try:
            return cls(name, memory_bytes)
        except OSError:
            return None

    def add_tree(self, pid: int) -> None:
        """Move `pid` and every descendant it has so far. A child forked after its parent moved
        is born inside; one forked before is found below: nothing escapes."""
        todo = [pid]
        while todo:
            p = todo.pop()
            for d in self.dirs.values():
                try:
                    with open(os.path.join(d, "cgroup.procs"), "w") as f:
                        f.write(str(p))
                except OSError:  # ESRCH: it has exited
                    pass
            todo += _children(p)

    def _write(self, controller: str, name: str, value: int) -> None:
        with open(os.path.join(self.dirs[controller], name), "w") as f:
            f.write(str(value))

    def _read(self, controller: str, name: str) -> str | None:
        if controller not in self.dirs:
            return None
        try:
            with open(os.path.join(self.dirs[controller], name)) as f:
                return f.read()
        except OSError:
            return None

    def memory_bytes(self) -> int | None:
        raw = self._read("memory", "memory.usage_in_bytes")
        return int(raw) if raw else None

    def cpu_s(self) -> float | None:
        raw = self._read("cpuacct", "cpuacct.usage")
        return int(raw) / 1e9 if raw else None

    def processes(self) -> int | None:
        raw = self._read("memory", "cgroup.procs")
        return None if raw is None else len(raw.split())

    def oom_kills(self) -> int:
        """Processes the kernel killed for this cgroup's memory limit so far."""
        for line in (self._read("memory", "memory.oom_control") or "").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def kill_all(self) -> None:
        for pid in (self._read("memory", "cgroup.procs") or "").split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass

    def remove(self, wait_s: float = 1.0) -> None:
        """Kill what is left and remove the folders (a process takes a moment to leave)."""
        deadline = time.monotonic() + wait_s
        for d in self.dirs.values():
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
    for parent in _parents().values():
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
