"""Unpacking OCI images and tar archives into a folder, without a daemon: our own layer applier.

An image is a list of tar layers applied in order. A `.wh.NAME` entry removes NAME of the layers
below; `.wh..wh..opq` in a folder hides everything the layers below put there (what the same
layer adds stays). The archive is untrusted (a task's image), so nothing may land outside the
root: absolute names, `..` components, hard links to outside, relative symlinks that climb out,
and entries that would be written through a symlink (which could lead anywhere) are refused
with the entry's name. Device nodes and fifos are skipped, setuid/setgid bits dropped, and every
file belongs to whoever unpacks (root for a template).

Formats read: `docker save` (manifest.json naming layer.tar files) and the OCI image layout
(index.json -> manifest -> layer blobs), each as a folder or a tar; layers plain or gzip.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import tarfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

from pydantic import BaseModel, ConfigDict, Field

from cadence.sandbox.fdtree import O_DIR, is_folder, lmode, make_dir, open_dir, remove

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
DIGEST = re.compile(r"^[a-z0-9]+(?:[+._-][a-z0-9]+)*:[a-zA-Z0-9=_-]+$")  # the OCI image spec's grammar
MAX_JSON_BYTES = 4 << 20  # a manifest or index: registries need only take 4 MiB (OCI distribution spec)
MAX_INDEX_DEPTH = 8  # image indexes within indexes (real images nest one or two)
MAX_LAYERS = 128  # Docker's overlay2 stops at 125; each layer of a gzip image tar may decompress it again from
# the start (a manifest may list layers out of order, or one many times)


class LayerError(ValueError):
    """A layer or archive that cannot be applied safely (the message names the entry)."""


class UnpackLimits(BaseModel):
    """What unpacking one image may write, over all its layers: a 20 KB image can otherwise
    expand to GiBs (a GNU sparse entry, a gzip bomb) or millions of files."""

    model_config = ConfigDict(extra="forbid")

    max_mb: int = Field(8192, ge=1, description="MiB of file contents written (counted as written, not as the headers say)")
    max_entries: int = Field(1_000_000, ge=1, description="tar entries read (the image archive's and its layers')")


class Budget:
    """Entries and bytes one unpacking has used so far, against its UnpackLimits."""

    def __init__(self, limits: UnpackLimits) -> None:
        self.limits, self.entries, self.bytes = limits, 0, 0

    def entry(self, name: str) -> None:
        self.entries += 1
        if self.entries > self.limits.max_entries:
            raise LayerError(f"entry {name!r}: the build reads more than {self.limits.max_entries} entries (max_entries: "
                             "raise it with `template build --max-entries N` or UnpackLimits(max_entries=N))")

    def copy(self, name: str, src: IO[bytes], out: IO[bytes]) -> None:
        """Copy `src` to `out`, counting each chunk before it is written."""
        while chunk := src.read(1 << 20):
            self.bytes += len(chunk)
            if self.bytes > self.limits.max_mb << 20:
                raise LayerError(f"entry {name!r}: the build writes more than {self.limits.max_mb} MiB (max_mb: "
                                 "raise it with `template build --max-mb N` or UnpackLimits(max_mb=N))")
            out.write(chunk)


def _parts(name: str, what: str) -> list[str]:
    """The path components of an archive name, refusing what could leave the root."""
    if name.startswith("/"):
        raise LayerError(f"{what} {name!r}: absolute path refused (a layer may only write inside its root)")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise LayerError(f"{what} {name!r}: '..' refused (a layer may only write inside its root)")
    return parts


def _parent(root: int, parts: list[str], name: str, create: bool = True) -> int | None:
    """An fd of the folder holding `parts[-1]`, walked from the folder fd `root` one component at
    a time, each a real folder (made when missing), never a symlink: no path is resolved twice,
    so nothing can be swapped between a check and its use. None when it does not exist and
    `create` is False. The caller closes it."""
    fd = os.dup(root)
    try:
        for i, part in enumerate(parts[:-1]):
            try:
                below = make_dir(part, fd) if create else open_dir(part, fd)
            except FileNotFoundError:
                os.close(fd)
                return None
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                where = "/".join(parts[:i + 1])
                if stat.S_ISLNK(lmode(part, fd)):  # for the message only: nothing was opened through it
                    raise LayerError(f"entry {name!r}: goes through the symlink {where!r}, refused "
                                     "(a link could lead out of the root)") from e
                raise LayerError(f"entry {name!r}: {where!r} is not a folder") from e
            os.close(fd)
            fd = below
        return fd
    except BaseException:
        os.close(fd)
        raise


def _whiteout_target(base: str, name: str) -> str:
    """The entry a whiteout `.wh.NAME` removes: one name of its own folder, like any component."""
    target = base[len(WHITEOUT):]
    if target in ("", ".", ".."):
        raise LayerError(f"whiteout {name!r}: removes {target!r}, refused (a whiteout removes one entry of its "
                         "own folder)")
    return target


def apply_layer(root: str | int, layer: IO[bytes], uid: int | None = None, gid: int | None = None,
                budget: Budget | None = None) -> None:
    """Apply one tar layer (plain or gzip, read as a stream) to the folder `root` (a path, or an
    open folder fd: every entry is then reached from its folder's fd, never through a path
    resolved again). `uid`/`gid`: the owner of what it creates (None: whoever runs this);
    `budget`: the entries and bytes it may still use (None: not counted)."""
    root_fd = os.open(root, O_DIR) if isinstance(root, str) else os.dup(root)
    added: set[str] = set()  # entries of this layer: an opaque marker hides the lower layers' only
    try:
        with tarfile.open(fileobj=layer, mode="r|*") as tar:
            for member in tar:
                if budget is not None:
                    budget.entry(member.name)
                parts = _parts(member.name, "entry")
                if not parts:
                    continue
                folder = _parent(root_fd, parts, member.name)
                try:
                    if _apply_entry(tar, member, root_fd, folder, parts, added, budget):
                        added.add("/".join(parts))
                        if uid is not None:
                            os.chown(parts[-1], uid, gid if gid is not None else uid, dir_fd=folder,
                                     follow_symlinks=False)
                        if not member.issym():
                            os.utime(parts[-1], (member.mtime, member.mtime), dir_fd=folder, follow_symlinks=False)
                finally:
                    os.close(folder)
    finally:
        os.close(root_fd)


def _apply_entry(tar: tarfile.TarFile, member: tarfile.TarInfo, root: int, folder: int, parts: list[str],
                 added: set[str], budget: Budget | None) -> bool:
    """Apply one entry in the folder fd `folder`; False when it adds nothing (a whiteout, an
    opaque marker, a device or fifo)."""
    base, rel = parts[-1], "/".join(parts)
    if base == OPAQUE:
        if rel in added:  # once per folder and layer: a marker repeated N times was N listings of it
            return False
        added.add(rel)
        for child in os.listdir(folder):
            if "/".join([*parts[:-1], child]) not in added:
                remove(child, folder)
        return False
    if base.startswith(WHITEOUT):
        remove(_whiteout_target(base, member.name), folder)
        return False
    if not (member.isdir() and is_folder(base, folder)):
        remove(base, folder)
    mode = member.mode & 0o1777  # no setuid/setgid
    if member.isdir():
        fd = make_dir(base, folder)
        os.fchmod(fd, mode | 0o700)
        os.close(fd)
    elif member.isreg():
        fd = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
        with os.fdopen(fd, "wb") as out:
            if budget is None:
                shutil.copyfileobj(tar.extractfile(member), out, 1 << 20)
            else:  # a sparse member or a gzip bomb expands here, so count what is written
                budget.copy(member.name, tar.extractfile(member), out)
            os.fchmod(fd, mode)
    elif member.issym():
        link = member.linkname
        if not link.startswith("/") and os.path.normpath(os.path.join(os.path.dirname(rel), link)).startswith(".."):
            raise LayerError(f"symlink {member.name!r} -> {link!r}: points out of the root, refused")
        os.symlink(link, base, dir_fd=folder)
    elif member.islnk():
        src_parts = _parts(member.linkname, f"hard link {member.name!r} ->")
        src_folder = _parent(root, src_parts, member.name, create=False) if src_parts else None
        try:
            if src_folder is None:
                raise FileNotFoundError
            os.link(src_parts[-1], base, src_dir_fd=src_folder, dst_dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError as e:
            raise LayerError(f"hard link {member.name!r} -> {member.linkname!r}: no such entry in the root") from e
        finally:
            if src_folder is not None:
                os.close(src_folder)
    else:
        return False  # devices and fifos: nothing a template needs
    return True


class _Archive:
    """An image as a folder or a tar: open a regular file in it by its name. Nothing outside the
    image is ever read: in a folder every component is opened from its parent's fd without
    following links (a link, a fifo or a device is refused); in a tar only regular members are
    read (a link member is refused, not resolved)."""

    def __init__(self, path: str, budget: Budget) -> None:
        self.path = path
        self.tar: tarfile.TarFile | None = None
        self.members: dict[str, tarfile.TarInfo] = {}
        if os.path.isdir(path):
            self.dir_fd: int | None = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            return
        self.dir_fd = None
        try:
            self.tar = tarfile.open(path, "r:*")
            for member in self.tar:  # the last of a name wins, as when a tar is extracted
                budget.entry(member.name)
                self.members[member.name.removeprefix("./")] = member
        except (tarfile.TarError, EOFError, zlib.error) as e:
            self.close()
            raise LayerError(f"{path}: not a readable tar archive ({type(e).__name__}: {e})") from e
        except LayerError:
            self.close()
            raise

    def has(self, name: str) -> bool:
        if self.tar is not None:
            return name in self.members
        try:
            os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    @contextmanager
    def open(self, name: str) -> Iterator[IO[bytes]]:
        parts = _parts(name, "image file")
        if not parts:
            raise LayerError(f"{self.path}: image file {name!r}: an empty name")
        if self.tar is None:
            with os.fdopen(_open_regular(self.dir_fd, parts, f"{self.path}: {name!r}"), "rb") as f:
                yield f
            return
        member = self.members.get("/".join(parts))
        if member is None:
            raise LayerError(f"{self.path}: {name!r} missing from the image archive")
        if not member.isreg():  # extractfile would resolve a link member to another one
            raise LayerError(f"{self.path}: {name!r} is not a regular file in the image archive (a link or "
                             "special file), refused")
        with self.tar.extractfile(member) as f:
            yield f

    def json(self, name: str) -> object:
        """A JSON file of the image, at most MAX_JSON_BYTES (a manifest or index is a few KB)."""
        with self.open(name) as f:
            data = f.read(MAX_JSON_BYTES + 1)
        if len(data) > MAX_JSON_BYTES:
            raise LayerError(f"{self.path}: {name!r} is larger than {MAX_JSON_BYTES >> 20} MiB, refused "
                             "(an image manifest or index is a few KB)")
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as e:
            raise LayerError(f"{self.path}: {name!r} is not JSON ({type(e).__name__}: {str(e)[:200]})") from e

    def close(self) -> None:
        if self.tar is not None:
            self.tar.close()
        if self.dir_fd is not None:
            os.close(self.dir_fd)


def _open_regular(dir_fd: int, parts: list[str], what: str) -> int:
    """An fd of the regular file `parts` under the folder `dir_fd`, each component opened from its
    parent's fd without following a link (no path is resolved twice, so nothing can be swapped
    between a check and the open); a fifo opens without blocking, then is refused with the rest."""
    folder_fd, opened = dir_fd, []
    try:
        for part in parts[:-1]:
            folder_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder_fd)
            opened.append(folder_fd)
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder_fd)
    except FileNotFoundError as e:
        raise LayerError(f"{what}: missing from the image folder") from e
    except OSError as e:  # ELOOP: a symlink; ENOTDIR: a folder on the way is a link or a file
        raise LayerError(f"{what}: goes through a symlink or a non-folder ({e.strerror}), refused (an image "
                         "is read only from inside its folder)") from e
    finally:
        for f in opened:
            os.close(f)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LayerError(f"{what}: not a regular file (a folder, fifo or device), refused")
    return fd


def _blob(digest: object) -> str:
    """The path of a blob in an OCI layout, from a digest `algorithm:encoded` (OCI image spec)."""
    if not isinstance(digest, str) or not DIGEST.match(digest):
        raise LayerError(f"digest {str(digest)[:100]!r}: not an OCI digest (algorithm:hex, e.g. sha256:...)")
    algo, _, hexdigest = digest.partition(":")
    return f"blobs/{algo}/{hexdigest}"


def _field(node: object, key: str, kind: type, where: str) -> object:
    """node[key] when node is a JSON object and that field a `kind`."""
    if not isinstance(node, dict) or not isinstance(node.get(key), kind):
        raise LayerError(f"{where}: no {key!r} {kind.__name__} (a malformed image manifest)")
    return node[key]


def _architecture(manifest: dict) -> object:
    platform = manifest.get("platform")
    return platform.get("architecture") if isinstance(platform, dict) else None


def _oci_layers(image: _Archive) -> list[str]:
    """The layer files of an OCI layout, following image indexes (linux/amd64 first, else the
    first), at most MAX_INDEX_DEPTH deep and never the same blob twice."""
    node, name, seen = image.json("index.json"), "index.json", set()
    for _ in range(MAX_INDEX_DEPTH):
        manifests = _field(node, "manifests", list, f"{image.path}: {name}")
        if not manifests or not all(isinstance(m, dict) for m in manifests):
            raise LayerError(f"{image.path}: {name}: an image index without manifests")
        pick = next((m for m in manifests if _architecture(m) in ("amd64", None)), manifests[0])
        name = _blob(pick.get("digest"))
        if name in seen:
            raise LayerError(f"{image.path}: image index {name!r} refers back to itself (a cycle), refused")
        seen.add(name)
        node = image.json(name)
        if isinstance(node, dict) and node.get("mediaType") not in INDEX_TYPES and "layers" in node:
            layers = _field(node, "layers", list, f"{image.path}: {name}")
            return [_blob(layer.get("digest") if isinstance(layer, dict) else None) for layer in layers]
    raise LayerError(f"{image.path}: image indexes nested more than {MAX_INDEX_DEPTH} deep, refused")


def image_layers(image: _Archive) -> list[str]:
    if image.has("manifest.json"):  # docker save (older Docker; newer ones write both)
        manifest = image.json("manifest.json")
        if not isinstance(manifest, list) or not manifest:
            raise LayerError(f"{image.path}: manifest.json: not a list of images (a malformed `docker save`)")
        layers = _field(manifest[0], "Layers", list, f"{image.path}: manifest.json")
        if not all(isinstance(n, str) for n in layers):
            raise LayerError(f"{image.path}: manifest.json: a layer name that is not a string")
    elif image.has("index.json"):
        layers = _oci_layers(image)
    else:
        raise LayerError(f"{image.path}: neither a `docker save` archive (manifest.json) nor an OCI layout (index.json)")
    if len(layers) > MAX_LAYERS:
        raise LayerError(f"{image.path}: {len(layers)} layers, more than {MAX_LAYERS} refused (Docker's overlay2 stops at 125)")
    return layers


def unpack_image(path: str, root: str, limits: UnpackLimits | None = None) -> int:
    """Apply every layer of the image at `path` (folder or tar) to `root`, in order, within
    `limits` (entries and bytes written, over the whole image); the count of layers."""
    budget = Budget(limits or UnpackLimits())
    image = _Archive(path, budget)
    try:
        layers = image_layers(image)
        for name in layers:
            with image.open(name) as layer:
                try:
                    apply_layer(root, layer, budget=budget)
                except (tarfile.TarError, EOFError, zlib.error) as e:
                    raise LayerError(f"{path}: layer {name!r} is not a readable tar ({type(e).__name__}: {e})") from e
    finally:
        image.close()
    return len(layers)
