"""A running sandbox's workspace from the host: seed it (files or a tar), read it back (a tar),
fork it into other sandboxes (a GRPO group of episodes starting from one prepared state), or
restore a snapshot into one (the same state, with no lock on the sandbox it was read from).

The host reaches the workspace (a tmpfs in the sandbox's mount namespace) through
/proc/<agent pid>/root/workspace, which needs root (the agent is non-dumpable); unisolated, it is
the host folder itself. The code inside may change the tree while the host works on it, so:
- the sandbox is frozen meanwhile (the cgroup freezer, verified frozen; SIGSTOP where the sandbox
  has no cgroup, which its code can defeat), so a fork copies one consistent state;
- and, whether or not freezing held, no path is trusted between check and use (fdtree.py): the
  tree is walked from directory fds, one component at a time, never through a symlink; an entry
  is pinned, fstat'ed, then opened as itself; symlinks are copied as links;
- files are read as their owner and written as the workspace's (setfsuid: a sandbox's uid, not
  root; the tmpfs belongs to the sandbox's user namespace), so a root-only host file stays
  unreadable even if a link were followed.

A fork copies: each workspace is a tmpfs of its own (so `disk_mb` and the memory cgroup hold),
and tmpfs has no reflinks and no hard links across file systems; the copy is in-kernel
(sendfile), about 1 GB/s here.
"""

from __future__ import annotations

import errno
import io
import os
import signal
import stat
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, NamedTuple

from cadence.sandbox.cgroup import CgroupError, _children
from cadence.sandbox.fdtree import (
    O_DIR,
    entries,
    is_folder,
    make_dir,
    owned_by,
    read_link,
    remove,
    reopen,
)
from cadence.sandbox.isolation import WORKSPACE
from cadence.sandbox.models import SandboxError
from cadence.sandbox.sandbox import LocalSandbox
from cadence.sandbox.template_layers import LayerError, _parent, _parts, apply_layer

CHUNK = 1 << 20  # bytes a snapshot reads and writes at a time
NOBODY = 65534  # the ids a root-owned workspace entry (foreign: no sandbox has the host's root) is read as


def host_path(box: LocalSandbox) -> str:
    """The host path of the sandbox's workspace (root only, for an isolated one)."""
    if not box.alive:
        raise SandboxError(f"sandbox {box.id} is not running")
    if box._workspace_host:
        return box._workspace_host
    if os.geteuid() != 0:
        raise SandboxError("seeding, reading back or forking a workspace needs the host to run as root "
                           "(it reaches the workspace through /proc/PID/root); use write_file/read_file")
    return f"/proc/{box.agent_host_pid()}/root{WORKSPACE}"


@contextmanager
def stopped(box: LocalSandbox) -> Iterator[None]:
    """Every process of the sandbox frozen meanwhile, and thawed after; its calls wait (the
    sandbox's lock). The cgroup freezer where the sandbox has one; SIGSTOP otherwise."""
    with box._lock:
        proc, cgroup = box.proc, box.cgroup  # once: a stop() from another thread sets both to None
        if proc is None:
            raise SandboxError(f"sandbox {box.id} is not running")
        if cgroup is None or not cgroup.can_freeze():
            with _sigstopped(proc.pid):
                yield
            return
        try:
            cgroup.freeze()
        except CgroupError as e:
            raise SandboxError(f"sandbox {box.id}: {e}") from e
        try:
            yield
        finally:
            cgroup.thaw()


@contextmanager
def _sigstopped(root_pid: int) -> Iterator[None]:
    """SIGSTOP to every process of the sandbox (`root_pid` and its descendants), SIGCONT after. Code
    inside can defeat it (a timer sending itself SIGCONT), so it only narrows the window: fdtree's
    walking is what holds."""
    seen: set[int] = set()
    try:
        while True:  # again until no new process appears (one may be forking)
            todo, new = [root_pid], []
            while todo:
                pid = todo.pop()
                todo += _children(pid)
                if pid not in seen:
                    new.append(pid)
            if not new:
                break
            for pid in new:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except OSError:
                    pass
            seen.update(new)
        yield
    finally:
        for pid in seen:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass


@contextmanager
def _workspace_fd(box: LocalSandbox) -> Iterator[int]:
    """The workspace folder's fd (the folder itself, not a symlink in its place)."""
    fd = os.open(host_path(box), O_DIR)
    try:
        yield fd
    finally:
        os.close(fd)


def seed(box: LocalSandbox, files: dict[str, bytes | str] | None = None, tar: bytes | str | None = None) -> None:
    """Put `files` (relative path -> content) and/or a tar (bytes, or a host path) in the workspace."""
    data = open(tar, "rb").read() if isinstance(tar, str) else tar
    with stopped(box), _workspace_fd(box) as ws, owned_by(ws):
        try:
            if data is not None:
                apply_layer(ws, io.BytesIO(data))
            for name, content in (files or {}).items():
                _write_file(ws, name, content.encode() if isinstance(content, str) else content)
        except LayerError as e:
            raise SandboxError(f"seed: {e}") from e


def _write_file(ws: int, name: str, content: bytes) -> None:
    parts = _parts(name, "file")
    folder = _parent(ws, parts, name)
    try:
        # O_NONBLOCK: a fifo there fails (ENXIO) instead of waiting for a reader.
        fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644,
                     dir_fd=folder)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise LayerError(f"file {name!r}: a link, folder or fifo is there already") from e
        raise
    finally:
        os.close(folder)
    with os.fdopen(fd, "wb") as out:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise LayerError(f"file {name!r}: something other than a file is there already")
        os.set_blocking(fd, True)
        out.truncate(0)
        out.write(content)


def snapshot(box: LocalSandbox, max_bytes: int | None = None) -> bytes:
    """The workspace as a tar (symlinks as links, nothing followed; fifos and sockets left out).
    `max_bytes`: the most the tar may hold (default: twice the sandbox's `disk_mb`); past it,
    SandboxError. A sparse file counts at its full size (the tar holds its zeros)."""
    buf = io.BytesIO()
    snapshot_to(box, buf, max_bytes)
    return buf.getvalue()


def snapshot_to(box: LocalSandbox, out: IO[bytes], max_bytes: int | None = None) -> None:
    """`snapshot`, streamed into the writable binary file `out` (a chunk at a time)."""
    cap = _Capped(out, max_bytes if max_bytes is not None else 2 * box.limits.disk_mb << 20)
    with stopped(box), _workspace_fd(box) as ws, tarfile.open(fileobj=cap, mode="w", copybufsize=CHUNK) as tar:
        _tar_tree(tar, cap, ws, "", os.fstat(ws).st_dev)


class _Capped(io.RawIOBase):
    """A writable file that refuses to grow past `max_bytes` (SandboxError naming the setting)."""

    def __init__(self, out: IO[bytes], max_bytes: int) -> None:
        self.out, self.max_bytes, self.written = out, max_bytes, 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.written

    def reserve(self, n: int, what: str) -> None:
        if self.written + n > self.max_bytes:
            raise SandboxError(f"snapshot: {what} would take the tar past max_bytes={self.max_bytes} "
                               f"({self.written} bytes so far; a sparse file counts at its full size): "
                               "pass a larger max_bytes, or make the workspace smaller")

    def write(self, data: bytes) -> int:
        self.reserve(len(data), "the next entry")
        self.written += len(data)
        return self.out.write(data)


def _tar_tree(tar: tarfile.TarFile, cap: _Capped, folder: int, prefix: str, dev: int) -> None:
    for name, pinned, st in entries(folder, dev):
        info = tarfile.TarInfo(prefix + name)
        info.mode, info.uid, info.gid, info.mtime = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, int(st.st_mtime)
        if stat.S_ISREG(st.st_mode):
            info.size = st.st_size
            cap.reserve(info.size + 2 * tarfile.BLOCKSIZE, repr(info.name))  # before reading any of it
            with os.fdopen(_reopen(pinned, info.name), "rb") as f:
                tar.addfile(info, _Exactly(f, info.size))
        elif stat.S_ISLNK(st.st_mode):
            info.type, info.linkname = tarfile.SYMTYPE, read_link(pinned)
            tar.addfile(info)
        elif stat.S_ISDIR(st.st_mode):
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
            sub = _reopen(pinned, info.name, os.O_RDONLY | os.O_DIRECTORY)
            try:
                _tar_tree(tar, cap, sub, info.name + "/", dev)
            finally:
                os.close(sub)
        # fifos, sockets: a running process's, not a state to keep


class _Exactly(io.RawIOBase):
    """`size` bytes of `f`, a chunk at a time: cut there if it grew, zeros if it shrank (the tar
    header already says `size`)."""

    def __init__(self, f: IO[bytes], size: int) -> None:
        self.f, self.left = f, size

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left, CHUNK)
        data = self.f.read(n) or b""
        data += bytes(n - len(data))
        self.left -= n
        return data


class Entry(NamedTuple):
    """One entry of a snapshot, ready to write: a file's bytes, a link's target, or a folder."""

    parts: list[str]
    kind: str  # "file", "link" or "folder"
    mode: int
    mtime: int
    data: bytes | memoryview = b""
    link: str = ""


def entries_of(tar: bytes) -> list[Entry]:
    """A `snapshot` tar's entries, read once (a group restores the same state into each of its runs'
    sandboxes); names that could leave the workspace are refused here (SandboxError). A file's
    data is a view into `tar` (the state is not held twice), a sparse member's a copy."""
    out, whole = [], memoryview(tar)
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as members:
        for m in members:
            try:
                parts = _parts(m.name, "entry")
            except LayerError as e:
                raise SandboxError(f"restore: {e}") from e
            mode, mtime = m.mode & 0o1777, int(m.mtime)  # no setuid/setgid
            if parts and m.isreg():
                data = members.extractfile(m).read() if m.issparse() else whole[m.offset_data:m.offset_data + m.size]
                out.append(Entry(parts, "file", mode, mtime, data=data))
            elif parts and m.issym():
                out.append(Entry(parts, "link", mode, mtime, link=m.linkname))
            elif parts and m.isdir():
                out.append(Entry(parts, "folder", mode, mtime))
    return out


def restore(box: LocalSandbox, state: list[Entry]) -> None:
    """Write a snapshot's entries (`entries_of`) into the workspace: files (with their mtimes, so
    bytecode caches stay valid), folders and symlinks (kept as links, as copy_workspace copies
    them; no whiteouts or hard links, unlike a template layer). What is there under the same names
    is replaced. Written as the workspace's owner, reached from folder fds, never through a link."""
    with stopped(box), _workspace_fd(box) as ws, owned_by(ws):
        for entry in state:
            try:
                folder = _parent(ws, entry.parts, "/".join(entry.parts))
            except LayerError as e:
                raise SandboxError(f"restore: {e}") from e
            try:
                _restore_entry(entry, folder)
            finally:
                os.close(folder)


def _restore_entry(entry: Entry, folder: int) -> None:
    name = entry.parts[-1]
    if entry.kind == "folder":
        try:
            os.close(make_dir(name, folder, entry.mode | 0o700))
        except OSError as e:  # something other than a folder is there (a link: ELOOP)
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            remove(name, folder)
            os.close(make_dir(name, folder, entry.mode | 0o700))
    elif entry.kind == "file":
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, 0o600, dir_fd=folder)
        except FileExistsError:
            remove(name, folder)
            fd = os.open(name, flags, 0o600, dir_fd=folder)
        try:
            view = memoryview(entry.data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, entry.mode)
            os.utime(fd, (entry.mtime, entry.mtime))
        finally:
            os.close(fd)
    else:
        try:
            os.symlink(entry.link, name, dir_fd=folder)
        except FileExistsError:
            remove(name, folder)
            os.symlink(entry.link, name, dir_fd=folder)


def copy_workspace(src: LocalSandbox, dst: LocalSandbox) -> None:
    """Copy `src`'s workspace into `dst`'s (both running); what `dst` has under the same names is replaced."""
    with stopped(src), stopped(dst), _workspace_fd(src) as a, _workspace_fd(dst) as b, owned_by(b):
        _copy_tree(a, b, os.fstat(a).st_dev)


def fork(box: LocalSandbox, into: LocalSandbox | None = None) -> LocalSandbox:
    """A sandbox like `box` (same limits, Python, template; started unless `into` is given, e.g.
    a warm spare) whose workspace is a copy of `box`'s now. Sessions and processes are not copied."""
    new = into or LocalSandbox(box.limits, box.python, box.allow_unisolated, python_packages=box.python_packages,
                               mounts=box.mounts, dev_tools=box.dev_tools, template=box.template).start()
    try:
        copy_workspace(box, new)
    except BaseException:
        if into is None:
            new.stop()
        raise
    return new


def _copy_tree(src: int, dst: int, dev: int, prefix: str = "") -> None:
    """Copy the folder `src` into the folder `dst` (fds). Each source entry is read as its owner;
    what is written belongs to whoever this thread acts as (the destination workspace's owner)."""
    for name, pinned, st in entries(src, dev):
        mode = stat.S_IMODE(st.st_mode) & 0o1777
        if stat.S_ISREG(st.st_mode):
            remove(name, dst)
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dst)
            try:
                source = _reopen(pinned, prefix + name)
                try:
                    offset = 0
                    while sent := os.sendfile(fd, source, offset, 1 << 30):  # in the kernel
                        offset += sent
                finally:
                    os.close(source)
            finally:
                os.close(fd)
        elif stat.S_ISLNK(st.st_mode):
            remove(name, dst)
            os.symlink(read_link(pinned), name, dir_fd=dst)
        elif stat.S_ISDIR(st.st_mode):
            if not is_folder(name, dst):
                remove(name, dst)
            sub_src = _reopen(pinned, prefix + name, os.O_RDONLY | os.O_DIRECTORY)
            sub_dst = make_dir(name, dst, mode | 0o700)
            try:
                _copy_tree(sub_src, sub_dst, dev, prefix + name + "/")
            finally:
                os.close(sub_src)
                os.close(sub_dst)
        # fifos, sockets: a running process's, not a state to copy


def _reopen(pinned: int, name: str, flags: int = os.O_RDONLY) -> int:
    """`fdtree.reopen` for the workspace entry `name`; a root-owned one is read as `nobody`."""
    try:
        return reopen(pinned, flags, (NOBODY, NOBODY))
    except PermissionError as e:
        raise SandboxError(f"workspace entry {name!r}: its owner may not read it (mode "
                           f"{stat.S_IMODE(os.fstat(pinned).st_mode):o}; the host reads a workspace as the "
                           "sandbox's uid): make it readable by its owner first") from e
