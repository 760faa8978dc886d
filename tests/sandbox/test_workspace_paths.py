"""Path handling and limits of the host's workspace and layer code (issue 33, findings 1, 11, 15):
whiteouts that name the folder above, reading as the entry's owner (never as root), the freezer's
verified wait, and the snapshot's byte cap on sparse files."""

from __future__ import annotations

import io
import os
import tarfile
import threading

import pytest

from cadence.sandbox import Limits, LocalSandbox, workspace
from cadence.sandbox.cgroup import V2_FILES, CgroupError, SandboxCgroup
from cadence.sandbox.fdtree import pin, reopen
from cadence.sandbox.models import SandboxError
from cadence.sandbox.template_layers import LayerError, apply_layer
from tests.sandbox.conftest import needs_bwrap

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (setfsuid, /proc/PID/root)")


def _layer(*names: str) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in names:
            tar.addfile(tarfile.TarInfo(name), io.BytesIO())
    buf.seek(0)
    return buf


@pytest.mark.parametrize("whiteout", [".wh...", ".wh..", ".wh.", "sub/.wh..."])
def test_a_whiteout_of_the_folder_itself_or_above_is_refused(tmp_path, whiteout):
    root = tmp_path / "above" / "root"
    (root / "sub").mkdir(parents=True)
    (tmp_path / "above" / "keep").write_text("mine")
    with pytest.raises(LayerError, match=f"whiteout {whiteout!r}: removes"):
        apply_layer(str(root), _layer(whiteout))
    assert (tmp_path / "above" / "keep").read_text() == "mine" and (root / "sub").is_dir()


def test_a_whiteout_still_removes_an_entry_of_its_folder(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "gone").write_text("x")
    (tmp_path / "sub" / "..kept").write_text("a name that starts with two dots is a name")
    apply_layer(str(tmp_path), _layer("sub/.wh.gone", "sub/.wh...kept.not"))
    assert os.listdir(tmp_path / "sub") == ["..kept"]


@needs_root
def test_entries_are_read_as_their_owner_and_never_as_root(tmp_path):
    folder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name, uid in (("theirs", 2_999_999), ("roots", 0)):
            with open(tmp_path / name, "w") as f:
                f.write(name)
            os.chown(tmp_path / name, uid, uid)
            os.chmod(tmp_path / name, 0o600)
        mine = pin("theirs", folder)
        fd = reopen(mine, os.O_RDONLY, (65534, 65534))
        assert os.read(fd, 10) == b"theirs"
        os.close(fd)
        os.fchmod(os.open(tmp_path / "theirs", os.O_RDONLY), 0o000)
        with pytest.raises(PermissionError):  # its owner may not read it: neither may the host
            reopen(mine, os.O_RDONLY, (65534, 65534))
        with pytest.raises(PermissionError):  # a root-only file is read as `nobody`
            reopen(pin("roots", folder), os.O_RDONLY, (65534, 65534))
    finally:
        os.close(folder)


def _fake_v2_cgroup(path: str, events: str) -> SandboxCgroup:
    """A SandboxCgroup over plain files, so the freezer's wait can be driven without a kernel."""
    cg = SandboxCgroup.__new__(SandboxCgroup)
    cg.version, cg.files, cg.dirs = 2, V2_FILES, {"memory": path}
    with open(os.path.join(path, "cgroup.events"), "w") as f:
        f.write(events)
    return cg


def test_freeze_waits_until_the_kernel_says_frozen_and_thaws_on_timeout(tmp_path):
    frozen = _fake_v2_cgroup(str(tmp_path), "populated 1\nfrozen 1\n")
    frozen.freeze(timeout_s=1)
    assert (tmp_path / "cgroup.freeze").read_text() == "1"
    stuck = _fake_v2_cgroup(str(tmp_path), "populated 1\nfrozen 0\n")
    with pytest.raises(CgroupError, match="did not freeze within 0.05 s"):
        stuck.freeze(timeout_s=0.05)
    assert (tmp_path / "cgroup.freeze").read_text() == "0"  # thawed again, not left half frozen


@needs_bwrap
@needs_root
def test_snapshot_of_sparse_files_stops_at_its_byte_cap():
    """Finding 15: tmpfs counts blocks, so 8 MB of disk holds any number of 60 MB holes; the tar
    would hold their zeros. The cap (twice disk_mb by default) stops it before any is read."""
    with LocalSandbox(Limits(wall_s=10, disk_mb=8)) as box:
        assert box.exec("for i in 1 2 3; do truncate -s 60M sparse$i; done; echo small > a").exit_code == 0
        with pytest.raises(SandboxError, match=r"'sparse1' would take the tar past max_bytes=16777216"):
            workspace.snapshot(box)
        with pytest.raises(SandboxError, match="max_bytes=1000"):
            workspace.snapshot(box, max_bytes=1000)
        box.exec("rm sparse*")
        out = io.BytesIO()
        workspace.snapshot_to(box, out)
        assert out.getvalue() == workspace.snapshot(box)
        assert tarfile.open(fileobj=io.BytesIO(out.getvalue())).extractfile("a").read() == b"small\n"


@needs_bwrap
def test_a_sandbox_stopped_while_frozen_dies():
    """A frozen process dies of SIGKILL only once thawed: stop() (a health check, a delete) during a
    workspace call must not wait for ever."""
    box = LocalSandbox(Limits(wall_s=10)).start()
    cg = box.cgroup
    if cg is None or not cg.can_freeze():
        box.stop()
        pytest.skip("no cgroup freezer here")
    cg.freeze()
    stopper = threading.Thread(target=box.stop, daemon=True)
    stopper.start()
    stopper.join(timeout=10)
    hung = stopper.is_alive()
    if hung:  # unblock it, then fail
        cg.thaw()
        stopper.join()
    assert not hung and not box.alive
    assert not any(os.path.exists(d) for d in cg.dirs.values())
