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

import json
import os
import shutil
import stat
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")


class LayerError(ValueError):
    """A layer or archive that cannot be applied safely (the message names the entry)."""


def _parts(name: str, what: str) -> list[str]:
    """The path components of an archive name, refusing what could leave the root."""
    if name.startswith("/"):
        raise LayerError(f"{what} {name!r}: absolute path refused (a layer may only write inside its root)")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise LayerError(f"{what} {name!r}: '..' refused (a layer may only write inside its root)")
    return parts


def _parent(root: str, parts: list[str], name: str, create: bool = True) -> str | None:
    """The host folder holding `parts[-1]`: every component below the root a real folder (made
    when missing), never a symlink. None when it does not exist and `create` is False."""
    path = root
    for part in parts[:-1]:
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            if not create:
                return None
            os.mkdir(path, 0o755)
            continue
        if stat.S_ISLNK(st.st_mode):
            raise LayerError(f"entry {name!r}: goes through the symlink {os.path.relpath(path, root)!r}, refused "
                             "(a link could lead out of the root)")
        if not stat.S_ISDIR(st.st_mode):
            raise LayerError(f"entry {name!r}: {os.path.relpath(path, root)!r} is not a folder")
    return path


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def apply_layer(root: str, layer: IO[bytes], uid: int | None = None, gid: int | None = None) -> None:
    """Apply one tar layer (plain or gzip, read as a stream) to the folder `root`. `uid`/`gid`:
    the owner of what it creates (None: whoever runs this)."""
    added: set[str] = set()  # entries of this layer: an opaque marker hides the lower layers' only
    with tarfile.open(fileobj=layer, mode="r|*") as tar:
        for member in tar:
            parts = _parts(member.name, "entry")
            if not parts:
                continue
            folder = _parent(root, parts, member.name)
            base, target = parts[-1], os.path.join(folder, parts[-1])
            rel = "/".join(parts)
            if base == OPAQUE:
                for child in os.listdir(folder):
                    if "/".join([*parts[:-1], child]) not in added:
                        _remove(os.path.join(folder, child))
                continue
            if base.startswith(WHITEOUT):
                _remove(os.path.join(folder, base[len(WHITEOUT):]))
                continue
            if not (member.isdir() and os.path.isdir(target) and not os.path.islink(target)):
                _remove(target)
            mode = member.mode & 0o1777  # no setuid/setgid
            if member.isdir():
                os.makedirs(target, exist_ok=True)
                os.chmod(target, mode | 0o700)
            elif member.isreg():
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as out:
                    shutil.copyfileobj(tar.extractfile(member), out, 1 << 20)
                os.chmod(target, mode)
            elif member.issym():
                link = member.linkname
                if not link.startswith("/") and os.path.normpath(os.path.join(os.path.dirname(rel), link)).startswith(".."):
                    raise LayerError(f"symlink {member.name!r} -> {link!r}: points out of the root, refused")
                os.symlink(link, target)
            elif member.islnk():
                src_parts = _parts(member.linkname, f"hard link {member.name!r} ->")
                src_folder = _parent(root, src_parts, member.name, create=False)
                src = os.path.join(src_folder, src_parts[-1]) if src_folder and src_parts else None
                if src is None or not os.path.lexists(src):
                    raise LayerError(f"hard link {member.name!r} -> {member.linkname!r}: no such entry in the root")
                os.link(src, target, follow_symlinks=False)
            else:
                continue  # devices and fifos: nothing a template needs
            added.add(rel)
            if uid is not None:
                os.chown(target, uid, gid if gid is not None else uid, follow_symlinks=False)
            if not member.issym():
                os.utime(target, (member.mtime, member.mtime), follow_symlinks=False)


class _Archive:
    """An image as a folder or a tar: open a file in it by its name."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.tar = None if os.path.isdir(path) else tarfile.open(path, "r:*")

    def names(self) -> set[str]:
        if self.tar is None:
            return {os.path.relpath(os.path.join(d, f), self.path) for d, _, fs in os.walk(self.path) for f in fs}
        return {m.name.removeprefix("./") for m in self.tar.getmembers() if m.isfile()}

    @contextmanager
    def open(self, name: str) -> Iterator[IO[bytes]]:
        parts = _parts(name, "image file")
        if self.tar is None:
            with open(os.path.join(self.path, *parts), "rb") as f:
                yield f
            return
        rel = "/".join(parts)
        member = next((m for m in self.tar.getmembers() if m.name.removeprefix("./") == rel), None)
        f = self.tar.extractfile(member) if member is not None else None
        if f is None:
            raise LayerError(f"{self.path}: {name!r} missing from the image archive")
        with f:
            yield f

    def json(self, name: str) -> dict | list:
        with self.open(name) as f:
            return json.load(f)

    def close(self) -> None:
        if self.tar is not None:
            self.tar.close()


def _blob(digest: str) -> str:
    algo, _, hexdigest = digest.partition(":")
    return f"blobs/{algo}/{hexdigest}"


def _oci_layers(image: _Archive) -> list[str]:
    """The layer files of an OCI layout, following image indexes (linux/amd64 first, else the first)."""
    node = image.json("index.json")
    while True:
        manifests = node.get("manifests") or []
        if not manifests:
            raise LayerError(f"{image.path}: an image index without manifests")
        pick = next((m for m in manifests if (m.get("platform") or {}).get("architecture") in ("amd64", None)), manifests[0])
        node = image.json(_blob(pick["digest"]))
        if node.get("mediaType") not in INDEX_TYPES and "layers" in node:
            return [_blob(layer["digest"]) for layer in node["layers"]]


def image_layers(image: _Archive) -> list[str]:
    names = image.names()
    if "manifest.json" in names:  # docker save (older Docker; newer ones write both)
        manifest = image.json("manifest.json")
        return list(manifest[0]["Layers"])
    if "index.json" in names:
        return _oci_layers(image)
    raise LayerError(f"{image.path}: neither a `docker save` archive (manifest.json) nor an OCI layout (index.json)")


def unpack_image(path: str, root: str) -> int:
    """Apply every layer of the image at `path` (folder or tar) to `root`, in order; the count."""
    image = _Archive(path)
    try:
        layers = image_layers(image)
        for name in layers:
            with image.open(name) as layer:
                apply_layer(root, layer)
    except (KeyError, IndexError, TypeError, json.JSONDecodeError) as e:
        raise LayerError(f"{path}: a malformed image manifest ({type(e).__name__}: {e})") from e
    finally:
        image.close()
    return len(layers)
