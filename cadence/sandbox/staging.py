"""Host folders a sandbox's uid cannot reach, made reachable to its bubblewrap only.

As root, every sandbox runs bwrap as a uid of its own (isolation.py). bwrap resolves the source
of each `--ro-bind` as that uid, so a source under a private folder (a pyenv interpreter in /root,
mode 700) cannot be bound, and `--ro-bind-fd` does not help: bwrap canonicalises the fd's path
and walks it again. Staging fixes that without touching the host's permissions or mount table:
the one thread that forks every sandbox (sandbox.py's spawner) moves into a private mount
namespace of its own, and there bind-mounts each such folder (or file) on an empty, world-
traversable mount point in a staging folder under /tmp. Its bwrap children inherit that
namespace and bind the staged path, read-only, at a neutral path inside the sandbox. On the host
the staging folder holds empty mount points only (one per staged path, shared by every process
of this user, so nothing piles up); nothing else sees the mounts.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import stat
import tempfile
import threading

from cadence.sandbox.models import IsolationUnavailable

CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_SLAVE, MNT_DETACH = 4096, 16384, 1 << 19, 2
ROOT = os.path.join(tempfile.gettempdir(), f"cadence-sandbox-stage-{os.geteuid()}")
# Folders made for sandboxes to see, read-only (a venv's skeleton, bin folders without debuggers).
VIEWS = os.path.join(tempfile.gettempdir(), f"cadence-sandbox-views-{os.geteuid()}")

_thread = threading.local()  # per thread: has it moved into its private mount namespace


def _libc_call(name: str, *args: object) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def root(folder: str = ROOT) -> str:
    """The staging folder (or VIEWS): ours, and writable by nobody else (its entries become mount
    targets, or what sandboxes are shown)."""
    try:
        os.mkdir(folder, 0o755)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise IsolationUnavailable(f"{folder}: not a folder of this user that only it can write; remove it")
    if st.st_mode & 0o777 != 0o755:
        os.chmod(folder, 0o755)  # mkdir's mode went through the umask; bwrap's uid walks through it
    return folder


def staged_path(host_path: str) -> str:
    """The path bwrap binds instead of `host_path` (mounted there by `mount_staged` on the spawner
    thread): the same host path always gets the same mount point."""
    real = os.path.realpath(host_path)
    is_dir = os.path.isdir(real)
    name = hashlib.sha256(real.encode()).hexdigest()[:20] + (".d" if is_dir else ".f")
    point = os.path.join(root(), name)
    try:
        if is_dir:
            os.mkdir(point, 0o755)
        else:
            os.close(os.open(point, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        pass
    return point


def enter_private_namespace() -> None:
    """Move the calling thread into a mount namespace of its own (once): what it mounts there is
    seen by the processes it forks (bwrap), never by the host. Raises OSError without CAP_SYS_ADMIN."""
    if not getattr(_thread, "private", False):
        _libc_call("unshare", CLONE_NEWNS)  # this thread only (a thread may: it implies CLONE_FS)
        # Slave: host mounts still reach us, ours never reach the host.
        _libc_call("mount", b"none", b"/", None, MS_REC | MS_SLAVE, None)
        _thread.private = True


def mount_staged(host_paths: list[str]) -> None:
    """Bind `host_paths` on their mount points, in the calling thread's private mount namespace
    (made on its first call). Call it from the thread that then forks bwrap. A point that does not
    show its path's file (not mounted yet, or a file replaced since: a bind pins the inode, and
    editors save by renaming a new file over the old one) is mounted again."""
    if not host_paths:
        return
    try:
        enter_private_namespace()
        for path in host_paths:
            real = os.path.realpath(path)
            point = staged_path(real)
            want, have = os.stat(real), os.stat(point)
            if (have.st_dev, have.st_ino) == (want.st_dev, want.st_ino):
                continue
            try:
                _libc_call("umount2", point.encode(), MNT_DETACH)  # a bind of a replaced file
            except OSError:
                pass  # nothing mounted there yet
            _libc_call("mount", real.encode(), point.encode(), None, MS_BIND | MS_REC, None)
    except OSError as e:
        raise IsolationUnavailable(
            f"cannot stage {host_paths[0]} for the sandbox's uid ({e}): the sandbox service needs "
            "CAP_SYS_ADMIN as root to bind a folder its sandboxes' uids cannot read; or give "
            "python= an interpreter every user can read (e.g. /usr/bin/python3)") from e
