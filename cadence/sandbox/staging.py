"""Host folders a sandbox's uid cannot reach, made reachable to its bubblewrap only.

As root, every sandbox runs bwrap as a uid of its own (isolation.py). bwrap resolves the source
of each `--ro-bind` as that uid, so a source under a private folder (a pyenv interpreter in /root,
mode 700) cannot be bound, and `--ro-bind-fd` does not help: bwrap canonicalises the fd's path
and walks it again. Staging fixes that without touching the host's permissions or mount table:
the one thread that forks every sandbox (sandbox.py's spawner) moves into a private mount
namespace of its own, and there bind-mounts each such folder (or file) on an empty, world-
traversable mount point under a staging folder in /tmp. Its bwrap children inherit that
namespace and bind the staged path, read-only, at a neutral path inside the sandbox. On the host
the staging folder holds empty mount points only; nothing else sees the mounts.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import tempfile
import threading

from cadence.sandbox.models import IsolationUnavailable

CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_SLAVE, MNT_DETACH = 4096, 16384, 1 << 19, 2

_lock = threading.Lock()
_root: str | None = None  # this process's staging folder
_root_pid = 0
_points: dict[str, str] = {}  # host path -> its mount point under _root
_thread = threading.local()  # per thread: is it in its private namespace, and what is mounted there


def _libc_call(name: str, *args: object) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def _cleanup(root: str, pid: int) -> None:
    if os.getpid() == pid:  # a forked child must not remove its parent's folder
        shutil.rmtree(root, ignore_errors=True)


def staged_path(host_path: str) -> str:
    """The path bwrap binds instead of `host_path` (mounted there by `mount_staged` on the spawner
    thread). The same host path always gets the same mount point in one process."""
    global _root, _root_pid
    host_path = os.path.realpath(host_path)
    with _lock:
        if _root is None or _root_pid != os.getpid():
            _root, _root_pid = tempfile.mkdtemp(prefix="cadence-sandbox-stage-"), os.getpid()
            os.chmod(_root, 0o755)  # bwrap, as the sandbox's uid, walks through it
            _points.clear()
            atexit.register(_cleanup, _root, _root_pid)
        point = _points.get(host_path)
        if point is None:
            point = os.path.join(_root, str(len(_points)))
            if os.path.isdir(host_path):
                os.mkdir(point, 0o755)
            else:
                os.close(os.open(point, os.O_CREAT | os.O_WRONLY, 0o644))
            _points[host_path] = point
        return point


def mount_staged(host_paths: list[str]) -> None:
    """Bind `host_paths` on their mount points, in the calling thread's private mount namespace
    (made on its first call). Call it from the thread that then forks bwrap."""
    if not host_paths:
        return
    try:
        if not getattr(_thread, "private", False):
            _libc_call("unshare", CLONE_NEWNS)  # this thread only (a thread may: it implies CLONE_FS)
            # Slave: host mounts still reach us, ours never reach the host.
            _libc_call("mount", b"none", b"/", None, MS_REC | MS_SLAVE, None)
            _thread.private, _thread.mounted = True, {}  # host path -> file version (None: a folder)
        for path in host_paths:
            real = os.path.realpath(path)
            point = staged_path(real)
            st = os.stat(real)
            version = None if os.path.isdir(real) else (st.st_dev, st.st_ino, st.st_mtime_ns)
            if real in _thread.mounted:
                if _thread.mounted[real] == version:
                    continue
                # A file bind pins its inode: an edited file (often a new inode) is bound again.
                _libc_call("umount2", point.encode(), MNT_DETACH)
            _libc_call("mount", real.encode(), point.encode(), None, MS_BIND | MS_REC, None)
            _thread.mounted[real] = version
    except OSError as e:
        raise IsolationUnavailable(
            f"cannot stage {host_paths[0]} for the sandbox's uid ({e}): the sandbox service needs "
            "CAP_SYS_ADMIN as root to bind a folder its sandboxes' uids cannot read; or give "
            "python= an interpreter every user can read (e.g. /usr/bin/python3)") from e
