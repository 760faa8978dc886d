"""A file tree that someone else may change while the host walks it (a running sandbox's
workspace): every step is taken from a directory fd, one component at a time, never through a
symlink, and a path is never checked and then resolved again.

An entry is first pinned (`O_PATH | O_NOFOLLOW`: needs no permission on the entry, follows
nothing); `fstat` of the pinned fd says what it is and whose; only then is it opened for
reading, through `/proc/self/fd/N` (the pinned inode itself, whatever the name points to by
now), as its owner (`setfsuid`): the host's root reads a workspace with the sandbox's uid, so a
root-only file stays unreadable even if something were followed. Writes go the same way: made
with `O_CREAT | O_EXCL | O_NOFOLLOW` (or mkdirat/symlinkat) in a directory fd, as the owner of
the folder written into.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager

O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
O_PIN = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC

_libc = ctypes.CDLL(None, use_errno=True)


@contextmanager
def fs_ids(uid: int, gid: int) -> Iterator[None]:
    """File system calls of this thread act as `uid`/`gid` meanwhile (setfsuid/setfsgid are per
    thread; a non-zero fsuid drops root's file capabilities, CAP_DAC_OVERRIDE included)."""
    old_gid, old_uid = _libc.setfsgid(gid), _libc.setfsuid(uid)
    try:
        # setfsuid reports the previous id, never an error: ask again (-1 changes nothing).
        if os.geteuid() == 0 and (_libc.setfsuid(-1), _libc.setfsgid(-1)) != (uid, gid):
            raise PermissionError(f"setfsuid({uid})/setfsgid({gid}) did not take")
        yield
    finally:
        _libc.setfsuid(old_uid)
        _libc.setfsgid(old_gid)


@contextmanager
def owned_by(fd: int) -> Iterator[os.stat_result]:
    """`fs_ids` of the owner of the object `fd` holds (its stat is yielded)."""
    st = os.fstat(fd)
    with fs_ids(st.st_uid, st.st_gid):
        yield st


def pin(name: str, dir_fd: int) -> int:
    """An O_PATH fd of the entry `name` of the folder `dir_fd` itself (a symlink stays a link)."""
    return os.open(name, O_PIN, dir_fd=dir_fd)


def reopen(pinned: int, flags: int, foreign: tuple[int, int]) -> int:
    """The pinned inode opened for real, as its owner (file permissions checked for that uid);
    one owned by root, which a sandbox cannot make, as the ids `foreign` (never as root)."""
    st = os.fstat(pinned)
    uid, gid = (st.st_uid, st.st_gid) if st.st_uid != 0 else foreign
    with fs_ids(uid, gid):
        return os.open(f"/proc/self/fd/{pinned}", flags | os.O_CLOEXEC)


def open_dir(name: str, dir_fd: int | None = None) -> int:
    """The folder `name` (of `dir_fd`), never a symlink: ELOOP or ENOTDIR otherwise."""
    return os.open(name, O_DIR, dir_fd=dir_fd)


def make_dir(name: str, dir_fd: int, mode: int = 0o755) -> int:
    """The folder `name` of `dir_fd`, made when missing (a symlink there: ELOOP)."""
    try:
        os.mkdir(name, mode, dir_fd=dir_fd)
    except FileExistsError:
        pass
    return open_dir(name, dir_fd)


def lmode(name: str, dir_fd: int) -> int:
    """The st_mode of the entry `name` of `dir_fd` itself, not of what a link points to (0: none)."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return 0


def is_folder(name: str, dir_fd: int) -> bool:
    return stat.S_ISDIR(lmode(name, dir_fd))


def remove(name: str, dir_fd: int) -> None:
    """Remove the entry `name` of `dir_fd` (a folder with all it holds; a link, not its target);
    nothing when it is missing. rmtree with a dir_fd walks by fds too, following nothing."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        try:
            os.unlink(name, dir_fd=dir_fd)
        except IsADirectoryError:  # swapped for a folder meanwhile
            shutil.rmtree(name, dir_fd=dir_fd)


def entries(dir_fd: int, dev: int) -> Iterator[tuple[str, int, os.stat_result]]:
    """(name, pinned fd, its stat) of each entry of the folder `dir_fd` (opened for reading), in
    name order; the pinned fd is closed when the next entry is taken. An entry gone meanwhile is
    skipped; one on another file system than `dev` (a mount point) refused (EXDEV). The lookup
    is the host's own (root's: a single name in a pinned folder, nothing followed, reaches that
    folder's entry and nothing else), so a folder its owner made unsearchable is still walked."""
    for name in sorted(os.listdir(dir_fd)):
        try:
            with fs_ids(os.geteuid(), os.getegid()):
                fd = pin(name, dir_fd)
        except FileNotFoundError:
            continue
        try:
            st = os.fstat(fd)
            if st.st_dev != dev:
                raise OSError(errno.EXDEV, "on another file system than the tree's, refused", name)
            yield name, fd, st
        finally:
            os.close(fd)


def read_link(pinned: int) -> str:
    """The target of the pinned symlink (readlinkat of an O_PATH fd with an empty name)."""
    return os.readlink("", dir_fd=pinned)
