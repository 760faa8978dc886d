"""A running sandbox's workspace from the host: seed it (files or a tar), read it back (a tar),
fork it into other sandboxes (a GRPO group of episodes starting from one prepared state).

The host reaches the workspace (a tmpfs in the sandbox's mount namespace) through
/proc/<agent pid>/root/workspace, which needs root (the agent is non-dumpable); unisolated, it is
the host folder itself. While it is read or written, every process of the sandbox is stopped
(SIGSTOP), so nothing inside can swap a folder for a symlink under the host's feet, and a fork
copies one consistent state. Nothing is followed: symlinks are copied as links, and a seed never
writes through one (template_layers.py). The host writes as the sandbox's uid (setfsuid: the
tmpfs belongs to the sandbox's user namespace, where the host's root has no uid).

A fork copies: each workspace is a tmpfs of its own (so `disk_mb` and the memory cgroup hold),
and tmpfs has no reflinks and no hard links across file systems; the copy is in-kernel
(sendfile), about 1 GB/s here.
"""

from __future__ import annotations

import ctypes
import io
import os
import signal
import stat
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager

from cadence.sandbox.cgroup import _children
from cadence.sandbox.isolation import WORKSPACE
from cadence.sandbox.models import SandboxError
from cadence.sandbox.sandbox import LocalSandbox
from cadence.sandbox.template_layers import LayerError, _parent, _parts, _remove, apply_layer


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


_libc = ctypes.CDLL(None, use_errno=True)


@contextmanager
def as_owner(folder: str) -> Iterator[None]:
    """File system calls of this thread act as the owner of `folder` meanwhile (setfsuid/setfsgid:
    per thread), so what they create is theirs and in their user namespace."""
    st = os.stat(folder)
    old_gid, old_uid = _libc.setfsgid(st.st_gid), _libc.setfsuid(st.st_uid)
    try:
        yield
    finally:
        _libc.setfsuid(old_uid)
        _libc.setfsgid(old_gid)


@contextmanager
def stopped(box: LocalSandbox) -> Iterator[None]:
    """Every process of the sandbox stopped (SIGSTOP) meanwhile, and continued after; its calls
    wait (the sandbox's lock)."""
    with box._lock:
        seen: set[int] = set()
        try:
            while True:  # again until no new process appears (one may be forking)
                todo, new = [box.proc.pid], []
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


def seed(box: LocalSandbox, files: dict[str, bytes | str] | None = None, tar: bytes | str | None = None) -> None:
    """Put `files` (relative path -> content) and/or a tar (bytes, or a host path) in the workspace."""
    ws = host_path(box)
    data = open(tar, "rb").read() if isinstance(tar, str) else tar
    with stopped(box), as_owner(ws):
        try:
            if data is not None:
                apply_layer(ws, io.BytesIO(data))
            for name, content in (files or {}).items():
                parts = _parts(name, "file")
                folder = _parent(ws, parts, name)
                path = os.path.join(folder, parts[-1])
                if os.path.islink(path) or os.path.isdir(path):
                    raise LayerError(f"file {name!r}: a link or folder is there already")
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
                with os.fdopen(fd, "wb") as out:
                    out.write(content.encode() if isinstance(content, str) else content)
        except LayerError as e:
            raise SandboxError(f"seed: {e}") from e


def snapshot(box: LocalSandbox) -> bytes:
    """The workspace as a tar (symlinks as links, nothing followed)."""
    ws = host_path(box)
    buf = io.BytesIO()
    with stopped(box), tarfile.open(fileobj=buf, mode="w") as tar:
        for name in sorted(os.listdir(ws)):
            tar.add(os.path.join(ws, name), arcname=name)  # tarfile.add lstat()s: links stay links
    return buf.getvalue()


def copy_workspace(src: LocalSandbox, dst: LocalSandbox) -> None:
    """Copy `src`'s workspace into `dst`'s (both running); what `dst` has under the same names is replaced."""
    a, b = host_path(src), host_path(dst)
    with stopped(src), stopped(dst):
        _copy_tree(a, b, b)


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


def _copy_tree(src: str, dst: str, owner: str) -> None:
    """Read as the host (the source may hold files only their owner reads), write as `owner`'s
    owner (the destination's workspace folder)."""
    for entry in os.scandir(src):
        s, d = entry.path, os.path.join(dst, entry.name)
        st = entry.stat(follow_symlinks=False)
        mode = stat.S_IMODE(st.st_mode) & 0o1777
        if stat.S_ISREG(st.st_mode):
            with open(s, "rb") as f, as_owner(owner):
                _remove_unless_folder(d, False)
                fd = os.open(d, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
                try:
                    offset = 0
                    while sent := os.sendfile(fd, f.fileno(), offset, 1 << 30):  # in the kernel
                        offset += sent
                finally:
                    os.close(fd)
        elif stat.S_ISLNK(st.st_mode):
            with as_owner(owner):
                _remove_unless_folder(d, False)
                os.symlink(os.readlink(s), d)
        elif stat.S_ISDIR(st.st_mode):
            with as_owner(owner):
                _remove_unless_folder(d, True)
                os.makedirs(d, mode | 0o700, exist_ok=True)
            _copy_tree(s, d, owner)
        # fifos, sockets: a running process's, not a state to copy


def _remove_unless_folder(path: str, keep_folder: bool) -> None:
    if os.path.lexists(path) and not (keep_folder and os.path.isdir(path) and not os.path.islink(path)):
        _remove(path)
