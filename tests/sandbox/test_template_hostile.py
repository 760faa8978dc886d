"""Hostile task images when building a template: expansion bombs (a GNU sparse entry, gzip, many
entries) stop at the build's limits, OCI index cycles and deep nesting are refused, and nothing
outside an image folder is ever read through a link (or blocks on a fifo)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
import threading

import pytest
from typer.testing import CliRunner

from cadence.sandbox.cli import app
from cadence.sandbox.template_layers import UnpackLimits, apply_layer
from cadence.sandbox.templates import TemplateError, TemplateStore
from tests.sandbox.conftest import needs_bwrap
from tests.sandbox.test_templates import _docker_save, _layer, _oci_layout, needs_root

SECRET = "host secret, mode 0600"


def _sparse_entry(name: str, real_size: int) -> bytes:
    """An old-GNU sparse tar entry: 512 bytes of data at the end of a `real_size` file, the rest a
    hole. Python's tarfile reads these (expanding the hole) but cannot write them."""
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode = tarfile.GNUTYPE_SPARSE, 512, 0o644
    header = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    header[386:410] = b"%011o\0%011o\0" % (real_size - 512, 512)  # the first sparse map entry
    header[483:495] = b"%011o\0" % real_size  # the real size
    header[148:156] = b" " * 8
    header[148:155] = b"%06o\0" % sum(header)  # the checksum, taken with its own field as spaces
    return bytes(header) + b"x" * 512


def _tar(entries: dict[str, bytes], extra: bytes = b"") -> bytes:
    """A tar of regular files, then `extra` (raw entries) and the end-of-archive blocks."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        body = buf.getvalue()[:tar.offset]  # before the end-of-archive blocks close() writes
    return body + extra + b"\0" * 1024


def _set_manifest(path: str, layers: list[str]) -> None:
    """Append to a `docker save` tar a manifest.json naming `layers` (the last of a name wins)."""
    manifest = json.dumps([{"Layers": layers}]).encode()
    with tarfile.open(path, "a") as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))


def _finishes(fn, timeout: float = 10.0):
    """fn()'s result or exception, failing (not hanging) when it loops or blocks for ever."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 (handed to the test thread)
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"still running after {timeout} s (a loop or a blocking open)"
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.fixture
def store(tmp_path):
    return TemplateStore(str(tmp_path / "store"), UnpackLimits(max_mb=16, max_entries=50))


def _built_nothing(store: TemplateStore) -> bool:
    return store.ls() == [] and os.listdir(os.path.join(store.path, "objects")) == []


def test_a_sparse_entry_is_counted_as_written_not_as_its_header(store, tmp_path):
    """Finding 12: a 10 KB image that unpacks to 17 MiB; the limit counts the bytes written."""
    layer = _tar({}, _sparse_entry("big", 17 << 20))
    image = _docker_save(str(tmp_path / "sparse.tar"), [layer])
    assert os.path.getsize(image) < 20_000
    with pytest.raises(TemplateError, match=r"'big': the build writes more than 16 MiB \(max_mb: raise it with "
                       r"`template build --max-mb N`"):
        store.build_from_image("sparse", image)
    assert _built_nothing(store)
    at_limit = _docker_save(str(tmp_path / "fits.tar"), [_tar({}, _sparse_entry("big", 16 << 20))])
    t = store.build_from_image("fits", at_limit)
    assert os.path.getsize(os.path.join(t.root, "big")) == 16 << 20


def test_a_gzip_bomb_stops_at_max_mb(store, tmp_path):
    bomb = gzip.compress(_tar({"zeros": bytes(24 << 20)}), 9)
    assert len(bomb) < 64_000
    image = _oci_layout(str(tmp_path / "oci"), [])
    _replace_layers(image, [bomb])
    with pytest.raises(TemplateError, match="more than 16 MiB"):
        store.build_from_image("bomb", image)
    assert _built_nothing(store)


def test_entries_are_capped_over_the_whole_image(store, tmp_path):
    layers = [_tar({f"f{i}": b"" for i in range(30)}), _tar({f"g{i}": b"" for i in range(30)})]
    image = _docker_save(str(tmp_path / "many.tar"), layers)
    with pytest.raises(TemplateError, match=r"more than 50 entries \(max_entries: raise it") as e:
        store.build_from_image("many", image)
    assert "\n" not in str(e.value)
    assert _built_nothing(store)


def test_a_manifest_naming_more_than_128_layers_is_refused(store, tmp_path):
    """Each layer of a gzip image tar may decompress it again from the start: 129 names of one
    layer were 129 passes."""
    path = _docker_save(str(tmp_path / "img.tar"), [_tar({"a": b"A"})])
    _set_manifest(path, ["layer0/layer.tar"] * 129)
    with pytest.raises(TemplateError, match="129 layers, more than 128 refused"):
        store.build_from_image("layers", path)


def test_a_repeated_opaque_marker_lists_its_folder_once(tmp_path, monkeypatch):
    """N files and N copies of `.wh..wh..opq` in one folder were N listings of N files: 2000 +
    2000 entries (a 2 MB layer) took 31 s at load 25, and the entry cap allows a million."""
    layer = _tar({**{f"d/f{i}": b"" for i in range(300)}, **{f"d/{'./' * i}.wh..wh..opq": b"" for i in range(300)}})
    listed = []
    real_listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda *a: listed.append(a) or real_listdir(*a))
    root = tmp_path / "root"
    root.mkdir()
    apply_layer(str(root), io.BytesIO(layer))
    assert len(listed) == 1 and len(real_listdir(root / "d")) == 300  # the layer's own files stay


def test_the_cli_takes_the_limits(tmp_path):
    image = _docker_save(str(tmp_path / "img.tar"), [_tar({"a": b"x" * (2 << 20)})])
    cli = CliRunner()
    args = ["template", "build", "t", "--from-image", image, "--store", str(tmp_path / "s")]
    r = cli.invoke(app, [*args, "--max-mb", "1"])
    assert r.exit_code == 2 and "max_mb" in r.stderr
    r = cli.invoke(app, [*args, "--max-mb", "3"])
    assert r.exit_code == 0, r.stderr


def _put(folder: str, data: bytes, digest: str | None = None) -> str:
    digest = digest or "sha256:" + hashlib.sha256(data).hexdigest()
    with open(os.path.join(folder, "blobs", *digest.split(":")), "wb") as f:
        f.write(data)
    return digest


def _replace_layers(folder: str, layers: list[bytes]) -> None:
    """Point the OCI layout's index at a new manifest of these layers."""
    manifest = {"schemaVersion": 2, "layers": [{"digest": _put(folder, b)} for b in layers]}
    with open(os.path.join(folder, "index.json"), "w") as f:
        json.dump({"manifests": [{"digest": _put(folder, json.dumps(manifest).encode())}]}, f)


def _index(*digests: str) -> bytes:
    return json.dumps({"mediaType": "application/vnd.oci.image.index.v1+json",
                       "manifests": [{"digest": d} for d in digests]}).encode()


@pytest.mark.parametrize("shape", ["self", "two-cycle", "too-deep"])
def test_oci_index_cycles_and_deep_nesting_are_refused(store, tmp_path, shape):
    """Finding 13: an index pointing to itself looped for ever in _oci_layers. A blob's name is
    trusted as its digest (a tool that checks digests could not make a cycle; a crafted folder can)."""
    folder = _oci_layout(str(tmp_path / "oci"), [])
    a, b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    if shape == "self":
        _put(folder, _index(a), a)
    elif shape == "two-cycle":
        _put(folder, _index(b), a)
        _put(folder, _index(a), b)
    else:
        chain = [f"sha256:{i:064x}" for i in range(12)]
        for here, there in zip(chain, chain[1:], strict=False):
            _put(folder, _index(there), here)
        a = chain[0]
    with open(os.path.join(folder, "index.json"), "w") as f:
        f.write(_index(a).decode())
    match = "nested more than 8 deep" if shape == "too-deep" else "refers back to itself"
    with pytest.raises(TemplateError, match=match):
        _finishes(lambda: store.build_from_image("cycle", folder))


@pytest.fixture
def host_secret(tmp_path):
    """A root-only tar and folder outside the image, as a host file an image could link to."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    secret = _layer([("stolen", "file", SECRET)])
    (private / "secret.tar").write_bytes(secret)
    (private / "secret.tar").chmod(0o600)
    (private / "manifest.json").write_text(json.dumps([{"Layers": ["secret.tar"]}]))
    return private


def _docker_folder(folder, layer_names: list[str]) -> None:
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps([{"Config": "c.json", "Layers": layer_names}]))


@pytest.mark.parametrize("how", ["layer-link", "folder-link", "manifest-link", "fifo"])
def test_a_folder_image_never_reads_through_a_link_or_blocks(store, tmp_path, host_secret, how):
    """Finding 14: a folder image's layer file linked to a host tar got that tar into the
    template. Every file the image reader opens (manifest, index, blob, layer) is opened from the
    image folder's fd without following links, and must be a regular file."""
    image = tmp_path / "image"
    if how == "layer-link":
        _docker_folder(image, ["layer0/layer.tar"])
        (image / "layer0").mkdir()
        (image / "layer0" / "layer.tar").symlink_to(host_secret / "secret.tar")
    elif how == "folder-link":  # a folder on the way to the layer links to a host folder
        _docker_folder(image, ["data/secret.tar"])
        (image / "data").symlink_to(host_secret)
    elif how == "manifest-link":
        image.mkdir()
        (image / "manifest.json").symlink_to(host_secret / "manifest.json")
    else:
        _docker_folder(image, ["layer.tar"])
        os.mkfifo(image / "layer.tar")
    with pytest.raises(TemplateError, match="symlink|not a regular file"):
        _finishes(lambda: store.build_from_image("linked", str(image)))
    assert _built_nothing(store)


def test_a_tar_image_reads_only_regular_members(store, tmp_path):
    """Link members of an image tar are refused, not resolved to another member."""
    layer = _layer([("a", "file", "A")])
    path = _docker_save(str(tmp_path / "img.tar"), [layer])
    with tarfile.open(path, "a") as tar:
        info = tarfile.TarInfo("linked.tar")
        info.type, info.linkname = tarfile.SYMTYPE, "layer0/layer.tar"
        tar.addfile(info)
    _set_manifest(path, ["linked.tar"])
    with pytest.raises(TemplateError, match="'linked.tar' is not a regular file"):
        store.build_from_image("links", path)


def test_an_oversized_manifest_is_refused_without_reading_it(store, tmp_path):
    """A sparse manifest.json of 64 MiB (2 KB in the tar) was read whole into memory."""
    path = str(tmp_path / "img.tar")
    with open(path, "wb") as f:
        f.write(_tar({}, _sparse_entry("manifest.json", 64 << 20)))
    with pytest.raises(TemplateError, match="'manifest.json' is larger than 4 MiB"):
        store.build_from_image("huge", path)


@pytest.mark.parametrize("index, why", [
    ([], "no 'manifests' list"),
    ({"manifests": [{"digest": 5}]}, "not an OCI digest"),
    ({"manifests": [{"digest": "sha256:../../etc"}]}, "not an OCI digest"),
    ({"manifests": [{"digest": "sha256:ab", "platform": "amd64"}]}, "missing from the image folder"),
    ("[" * 100_000, "not JSON"),
])
def test_a_malformed_index_is_a_one_line_error(store, tmp_path, index, why):
    folder = _oci_layout(str(tmp_path / "oci"), [])
    with open(os.path.join(folder, "index.json"), "w") as f:
        f.write(index if isinstance(index, str) else json.dumps(index))
    with pytest.raises(TemplateError, match=why) as e:
        store.build_from_image("bad", folder)
    assert "\n" not in str(e.value)


def _own_system(folder, script: str, tools: tuple[str, ...] = ()) -> str:
    """A template folder whose python3 is a shell script, with the host's sh and `tools` (and the
    libraries they load) copied in."""
    # Without LD_PRELOAD: vLLM's CPU platform sets it in this process once imported, and ldd would
    # list the preloaded venv libraries (under /tmp when the checkout is there) as the tool's own.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    for tool in ("/bin/sh", *tools):
        ldd = subprocess.run(["ldd", tool], capture_output=True, text=True, env=env).stdout
        for path in [tool, *(w for w in ldd.split() if w.startswith("/"))]:
            (folder / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, folder / path.lstrip("/"))
    (folder / "usr" / "bin").mkdir(parents=True, exist_ok=True)
    (folder / "usr" / "bin" / "python3").write_text("#!/bin/sh\n" + script)
    (folder / "usr" / "bin" / "python3").chmod(0o755)
    for mount_point in ("proc", "dev", "tmp"):
        (folder / mount_point).mkdir()
    return str(folder)


@needs_bwrap
@pytest.mark.parametrize("script, why", [
    ("exec /usr/bin/yes\n", "printed 1 MiB or more when asked its version"),  # read whole into host memory before
    ("echo not json\n", "answered 'not json"),  # a JSONDecodeError traceback before
])
def test_a_templates_python_is_asked_its_version_within_bounds(store, tmp_path, script, why):
    """The build runs the image's own python3 on the host (in bwrap) to learn its version: its
    output is bounded (it went to a pipe read into memory until the 60 s timeout) and checked."""
    with pytest.raises(TemplateError, match=why):
        store.build_from_dir("own", _own_system(tmp_path / "root", script, ("/usr/bin/yes",)))
    assert _built_nothing(store)


@pytest.mark.parametrize("kind, why", [
    ("fifo", "/node': a fifo, device or socket, refused"),  # shutil.Error traceback before
    pytest.param("device", "/node': a fifo, device or socket, refused", marks=needs_root),  # /dev/zero: copied for ever
    ("sparse", "/a': the build writes more than 16 MiB"),  # 64 MiB of zeros written before
    ("many", "more than 50 entries"),
])
def test_a_folder_is_copied_within_the_limits(store, tmp_path, kind, why):
    """--from-dir: a task's folder (extracted from its tarball as root) may hold a device node,
    a fifo, a sparse file or too many files, like an image."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_text("A")
    if kind == "fifo":
        os.mkfifo(src / "node")
    elif kind == "device":
        os.mknod(src / "node", 0o644 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers
    elif kind == "sparse":
        os.truncate(src / "a", 64 << 20)
    else:
        for i in range(60):
            (src / f"f{i}").write_text("")
    with pytest.raises(TemplateError, match=why):
        _finishes(lambda: store.build_from_dir("copied", str(src)))
    assert _built_nothing(store)


@needs_root
def test_a_failed_build_detaches_its_mounts_before_removing_its_folder(store, tmp_path, monkeypatch):
    """A failed mmdebstrap left its root's /proc mounted (seen here); the build's folder was then
    rmtree'd through whatever was mounted in it, and the mount outlived the build."""
    from cadence.sandbox import staging, templates

    host = tmp_path / "host"
    host.mkdir()
    (host / "keep").write_text("a host file")

    def failing_mmdebstrap(root: str, *args) -> None:
        os.mkdir(os.path.join(root, "mnt"))
        staging._libc_call("mount", str(host).encode(), os.path.join(root, "mnt").encode(), None, 4096)  # MS_BIND
        raise TemplateError("mmdebstrap failed (1): no network")

    monkeypatch.setattr(templates, "_mmdebstrap", failing_mmdebstrap)
    monkeypatch.setattr(templates.shutil, "which", lambda name: f"/usr/bin/{name}")
    with pytest.raises(TemplateError, match="no network"):
        store.build_debian("deb", ["cowsay"])
    with open("/proc/self/mountinfo") as f:
        assert store.path not in f.read()
    assert (host / "keep").read_text() == "a host file"
    assert _built_nothing(store)
