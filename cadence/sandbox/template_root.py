"""A sandbox's root on a template: the template read-only under a copy-on-write layer of its own.

bubblewrap 0.8 (Debian 12) has no overlay options (they came in 0.9), so the overlay is mounted
here, by the thread that forks every sandbox, in its private mount namespace (staging.py): a
tmpfs of `disk_mb` per sandbox holds the upper and work folders, overlayfs merges them over the
template's root, and bwrap binds the merged folder as the sandbox's `/`. Writes anywhere in the
root go to that tmpfs (copy-up), never to the template; they count against the sandbox's memory
cgroup and stop at `disk_mb`. Once the agent answers, bwrap's namespace holds its own reference
to the mounts, so they are detached here: nothing lingers after the sandbox dies, and nothing is
ever visible to the host. Needs CAP_SYS_ADMIN (root), like staging.

The template's files belong to root on the host, so inside (uid 65534) the copy-on-write layer
takes writes where the template's modes allow them (its /tmp, world-writable folders), as for a
container's non-root user; the workspace (/workspace) and /tmp are the sandbox's own tmpfs.
"""

from __future__ import annotations

import os
import stat
import tempfile
import uuid
from dataclasses import dataclass

from cadence.sandbox import staging
from cadence.sandbox.models import IsolationUnavailable
from cadence.sandbox.templates import Template

ROOTS = os.path.join(tempfile.gettempdir(), f"cadence-sandbox-roots-{os.geteuid()}")
MNT_DETACH = 2
# bwrap options and how many arguments each takes; for those that mount, which argument is the
# place inside (mount points missing from the template are made in the copy-on-write layer).
MOUNTS_AT = {"--bind": 1, "--ro-bind": 1, "--dev-bind": 1, "--bind-try": 1, "--ro-bind-try": 1,
             "--symlink": 1, "--tmpfs": 0, "--proc": 0, "--dev": 0, "--dir": 0, "--mqueue": 0}
ARGS = {**{k: 2 if v else 1 for k, v in MOUNTS_AT.items()}, "--setenv": 2, "--size": 1, "--uid": 1, "--gid": 1,
        "--hostname": 1, "--seccomp": 1, "--perms": 1, "--unsetenv": 1, "--chdir": 1, "--remount-ro": 1,
        "--chmod": 2, "--file": 2, "--bind-data": 2, "--ro-bind-data": 2, "--add-seccomp-fd": 1,
        "--cap-add": 1, "--info-fd": 1, "--userns-block-fd": 1}


@dataclass
class TemplateRoot:
    template: Template
    point: str  # the sandbox's folder on the host (a tmpfs: upper/, work/, root/ the merged view)
    size_bytes: int
    owner: int | None  # the sandbox's host uid: owns the root folder, where bwrap makes its links

    @classmethod
    def for_sandbox(cls, template: Template, disk_mb: int, owner: int | None) -> TemplateRoot:
        if any(c in template.root for c in ",:"):
            raise IsolationUnavailable(f"template {template.name!r}: its store path {template.root!r} has ',' or "
                                       "':' (overlayfs options cannot hold them); use another CADENCE_TEMPLATE_DIR")
        return cls(template, os.path.join(staging.root(ROOTS), uuid.uuid4().hex[:16]), disk_mb << 20, owner)

    @property
    def merged(self) -> str:
        return os.path.join(self.point, "root")

    def mount(self, argv: list[str]) -> None:
        """Mount the copy-on-write root and make the mount points bwrap needs (on the spawner thread)."""
        try:
            staging.enter_private_namespace()
            os.mkdir(self.point, 0o755)
            staging._libc_call("mount", b"tmpfs", self.point.encode(), b"tmpfs", 0,
                               f"size={self.size_bytes},mode=0755".encode())
            for sub in ("upper", "work", "root"):
                os.mkdir(os.path.join(self.point, sub), 0o755)
            opts = f"lowerdir={self.template.root},upperdir={self.point}/upper,workdir={self.point}/work"
            staging._libc_call("mount", b"overlay", self.merged.encode(), b"overlay", 0, opts.encode())
        except OSError as e:
            self.release()
            raise IsolationUnavailable(
                f"template {self.template.name!r}: cannot mount its copy-on-write root ({e}); a sandbox on a "
                "template needs root (CAP_SYS_ADMIN) and overlayfs") from e
        upper = os.path.join(self.point, "upper")
        os.chmod(upper, 0o755)
        if self.owner is not None:  # the merged root folder takes the upper folder's owner
            os.chown(upper, self.owner, self.owner)
        make_mount_points(self.merged, argv)

    def release(self) -> None:
        """Detach the mounts from the spawner's namespace (a running sandbox keeps its own)."""
        for path in (self.merged, self.point):
            try:
                staging._libc_call("umount2", path.encode(), MNT_DETACH)
            except OSError:
                pass
        try:
            os.rmdir(self.point)
        except OSError:
            pass


def make_mount_points(merged: str, argv: list[str]) -> None:
    """Make, in the copy-on-write layer, the places where bwrap mounts over the template's root
    (bwrap runs as the sandbox's uid, which cannot create them in the template's folders). A place
    under an earlier mount is inside that mount (bwrap's), not in the template's root."""
    covered: list[str] = []
    for opt, args in mount_ops(argv, argv.index("/") + 1):  # after `--bind MERGED /`
        inside = args[MOUNTS_AT[opt]]
        if any(inside == c or inside.startswith(c.rstrip("/") + "/") for c in covered):
            continue
        covered.append(inside)
        host = _no_links_to(merged, inside)
        if os.path.islink(host) and opt != "--symlink":
            raise IsolationUnavailable(f"template: {inside!r} cannot be mounted: it is a symlink in the template; "
                                       "remove it from the template")
        if os.path.lexists(host) or opt == "--symlink":  # bwrap makes links (in the root, which it owns)
            continue
        if opt in ("--bind", "--ro-bind", "--dev-bind", "--bind-try", "--ro-bind-try") and not os.path.isdir(args[0]):
            os.close(os.open(host, os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW, 0o644))
        else:
            os.mkdir(host, 0o755)


def mount_ops(argv: list[str], start: int) -> list[tuple[str, list[str]]]:
    """The bwrap options from argv[start] on that mount something, with their arguments (the
    place inside is args[MOUNTS_AT[opt]]), in order, up to the command."""
    ops, i = [], start
    while i < len(argv) and argv[i].startswith("--"):
        opt, n = argv[i], ARGS.get(argv[i], 0)
        if opt in MOUNTS_AT:
            ops.append((opt, argv[i + 1:i + 1 + n]))
        i += 1 + n
    return ops


def _no_links_to(merged: str, inside: str) -> str:
    """The host path of `inside` under the merged root, its parent folders made (0755), refusing a
    symlink on the way: as root here, following one of the template's links would write on the host."""
    path = merged
    parts = [p for p in inside.split("/") if p]
    for part in parts[:-1]:
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            os.mkdir(path, 0o755)
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise IsolationUnavailable(f"template: {inside!r} cannot be mounted: {os.path.relpath(path, merged)!r} in "
                                       "the template is a symlink or a file; remove it from the template")
    return os.path.join(path, parts[-1])
