"""Templates: building from a folder and an OCI archive, refusing a malicious layer, running on a
template, its copy-on-write layer, seeding, reading back and forking a workspace."""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile

import pytest

from cadence.sandbox import Limits, LocalSandbox, workspace
from cadence.sandbox.models import ExecRequest, SandboxError
from cadence.sandbox.template_layers import LayerError, apply_layer
from cadence.sandbox.templates import TemplateError, TemplateStore
from tests.sandbox.conftest import needs_bwrap

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a sandbox on a template needs root (CAP_SYS_ADMIN) "
                                "for its copy-on-write mount; CI runs as root")


def _layer(entries: list[tuple], compress: bool = False) -> bytes:
    """A tar layer from (name, kind, payload) entries: kind file/dir/symlink/hardlink."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, payload in entries:
            info = tarfile.TarInfo(name)
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, payload
                tar.addfile(info)
            elif kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, payload
                tar.addfile(info)
            else:
                data = payload.encode()
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    return gzip.compress(raw) if compress else raw


def _docker_save(path: str, layers: list[bytes]) -> str:
    """A `docker save` archive: manifest.json and one layer.tar per layer."""
    with tarfile.open(path, "w") as tar:
        names = []
        for i, layer in enumerate(layers):
            names.append(f"layer{i}/layer.tar")
            info = tarfile.TarInfo(names[-1])
            info.size = len(layer)
            tar.addfile(info, io.BytesIO(layer))
        manifest = json.dumps([{"Config": "config.json", "RepoTags": ["t:latest"], "Layers": names}]).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
    return path


def _oci_layout(folder: str, layers: list[bytes]) -> str:
    """An OCI image layout folder: index.json -> manifest -> gzip layer blobs."""
    import hashlib

    blobs = os.path.join(folder, "blobs", "sha256")
    os.makedirs(blobs)

    def put(data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        with open(os.path.join(blobs, digest), "wb") as f:
            f.write(data)
        return f"sha256:{digest}"

    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "layers": [{"digest": put(layer), "size": len(layer)} for layer in layers]}
    index = {"schemaVersion": 2, "manifests": [{"digest": put(json.dumps(manifest).encode()),
                                                "mediaType": manifest["mediaType"]}]}
    with open(os.path.join(folder, "index.json"), "w") as f:
        json.dump(index, f)
    return folder


@pytest.fixture
def store(tmp_path):
    return TemplateStore(str(tmp_path / "store"))


def test_layers_apply_in_order_with_whiteouts_and_opaque_folders(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    apply_layer(str(root), io.BytesIO(_layer([
        ("etc", "dir", None), ("etc/keep", "file", "1"), ("etc/gone", "file", "2"),
        ("opt", "dir", None), ("opt/old", "file", "3"), ("link", "symlink", "etc/keep"),
    ])))
    apply_layer(str(root), io.BytesIO(_layer([
        ("etc/.wh.gone", "file", ""), ("opt/new", "file", "4"), ("opt/.wh..wh..opq", "file", ""),
        ("etc/keep", "file", "changed"), ("etc/hard", "hardlink", "etc/keep"),
    ], compress=True)))
    assert sorted(os.listdir(root / "etc")) == ["hard", "keep"]
    assert os.listdir(root / "opt") == ["new"]  # opaque: the lower layer's old is hidden, this layer's new stays
    assert (root / "etc/keep").read_text() == "changed" and (root / "link").read_text() == "changed"
    assert os.stat(root / "etc/hard").st_ino == os.stat(root / "etc/keep").st_ino


@pytest.mark.parametrize("entries, why", [
    ([("/etc/passwd", "file", "x")], "absolute"),
    ([("a/../../escape", "file", "x")], "'..'"),
    ([("out", "symlink", "../../../etc"), ], "points out of the root"),
    ([("lnk", "symlink", "/"), ("lnk/etc/evil", "file", "x")], "goes through the symlink"),
    ([("h", "hardlink", "/etc/passwd")], "absolute"),
    ([("h", "hardlink", "../outside")], "'..'"),
])
def test_a_malicious_layer_is_refused_and_writes_nothing_outside(tmp_path, entries, why):
    root = tmp_path / "deep" / "root"
    root.mkdir(parents=True)
    (tmp_path / "outside").write_text("host file")
    with pytest.raises(LayerError, match=why):
        apply_layer(str(root), io.BytesIO(_layer(entries)))
    assert sorted(os.listdir(tmp_path)) == ["deep", "outside"] and os.listdir(tmp_path / "deep") == ["root"]
    assert (tmp_path / "outside").read_text() == "host file"


def test_build_from_a_folder_is_cached_by_content(store, tmp_path):
    src = tmp_path / "src"
    (src / "data").mkdir(parents=True)
    (src / "data" / "x.txt").write_text("one")
    a = store.build_from_dir("alpha", str(src))
    b = store.build_from_dir("beta", str(src))  # same recipe: built once, two names
    assert a.key == b.key and a.python is None
    assert [t.name for t in store.ls()] == ["alpha", "beta"]
    (src / "data" / "y.txt").write_text("two")
    c = store.build_from_dir("alpha", str(src))  # changed folder: a new key, the name moves to it
    assert c.key != a.key and (open(os.path.join(c.root, "data", "y.txt")).read() == "two")
    store.rm("beta")
    assert not os.path.exists(os.path.dirname(a.root))  # nobody uses the old key any more
    with pytest.raises(TemplateError, match="not in"):
        store.get("beta")
    with pytest.raises(TemplateError, match="template name"):
        store.build_from_dir("Bad Name!", str(src))


def test_a_folder_with_a_system_but_no_python_is_refused(store, tmp_path):
    (tmp_path / "src" / "usr" / "bin").mkdir(parents=True)
    with pytest.raises(TemplateError, match="no python3"):
        store.build_from_dir("nopy", str(tmp_path / "src"))


@pytest.mark.parametrize("fmt", ["docker-save", "oci-layout"])
def test_build_from_an_image_archive(store, tmp_path, fmt):
    layers = [_layer([("srv", "dir", None), ("srv/a", "file", "A"), ("srv/b", "file", "B")]),
              _layer([("srv/.wh.b", "file", ""), ("srv/c", "file", "C")], compress=True)]
    image = (_docker_save(str(tmp_path / "img.tar"), layers) if fmt == "docker-save"
             else _oci_layout(str(tmp_path / "oci"), layers))
    t = store.build_from_image("img", image)
    assert sorted(os.listdir(os.path.join(t.root, "srv"))) == ["a", "c"]


def test_an_image_with_an_escaping_layer_builds_nothing(store, tmp_path):
    image = _docker_save(str(tmp_path / "bad.tar"), [_layer([("../../x", "file", "pwned")])])
    with pytest.raises(TemplateError, match="'..' refused"):
        store.build_from_image("bad", image)
    assert store.ls() == [] and [n for n in os.listdir(os.path.join(store.path, "objects"))] == []


@pytest.fixture
def files_template(store, tmp_path):
    src = tmp_path / "tpl"
    (src / "data").mkdir(parents=True)
    (src / "data" / "only-here.txt").write_text("from the template\n")
    (src / "data" / "shared.txt").write_text("original\n")
    os.chmod(src / "data", 0o777)  # the sandbox's user may write here (through its copy-on-write layer)
    os.chmod(src / "data" / "shared.txt", 0o666)
    return store.build_from_dir("files", str(src))


@needs_bwrap
@needs_root
def test_a_sandbox_on_a_template_sees_its_files_and_cannot_change_it(files_template):
    with LocalSandbox(Limits(wall_s=10), template=files_template) as sb:
        r = sb.exec("cat /data/only-here.txt; echo edited > /data/shared.txt; touch /data/new; cat /data/shared.txt")
        assert r.exit_code == 0, r.stderr
        assert r.stdout == "from the template\nedited\n"
        assert sb.exec(code="import sys; print(sys.version_info[0])").stdout == "3\n"  # the host's Python over it
    root = files_template.root
    assert open(os.path.join(root, "data", "shared.txt")).read() == "original\n"
    assert sorted(os.listdir(os.path.join(root, "data"))) == ["only-here.txt", "shared.txt"]
    with LocalSandbox(Limits(wall_s=10), template=files_template) as again:  # a fresh layer per sandbox
        assert again.exec("cat /data/shared.txt; ls /data").stdout == "original\nonly-here.txt\nshared.txt\n"


@needs_bwrap
def test_without_a_template_the_root_stays_read_only(box):
    r = box.exec("touch /newfile")
    assert r.exit_code != 0 and "Read-only" in r.stderr


@needs_bwrap
@needs_root
def test_seed_read_back_and_fork_a_workspace(files_template):
    files = {"src/main.py": "print('prepared')", "notes.txt": b"n"}
    with LocalSandbox(Limits(wall_s=10), template=files_template) as sb:
        workspace.seed(sb, files=files, tar=_layer([("data", "dir", None), ("data/in.csv", "file", "1,2\n")]))
        assert sb.exec("python3 src/main.py; cat data/in.csv; stat -c %u notes.txt").stdout == "prepared\n1,2\n65534\n"
        sb.exec("echo state > step1; ln -s /etc/passwd link; chmod 600 notes.txt")
        forks = [workspace.fork(sb) for _ in range(2)]
        try:
            sb.exec("echo later > step1")  # the parent moves on: forks keep the state they copied
            for f in forks:
                assert f.template == files_template
                assert f.exec("cat step1 notes.txt; readlink link").stdout == "state\nn/etc/passwd\n"
                assert f.exec("echo mine > step1").exit_code == 0  # its own copy, writable
            assert sb.exec("cat step1").stdout == "later\n"
            names = sorted(tarfile.open(fileobj=io.BytesIO(workspace.snapshot(forks[0]))).getnames())
            assert names == ["data", "data/in.csv", "link", "notes.txt", "src", "src/main.py", "step1"]
        finally:
            for f in forks:
                f.stop()
        with pytest.raises(SandboxError, match="goes through the symlink"):
            workspace.seed(sb, files={"link/x": "no"})


@needs_bwrap
@needs_root
def test_cli_builds_lists_runs_on_and_removes_a_template(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from cadence.sandbox.cli import app

    src = tmp_path / "src" / "task"
    src.mkdir(parents=True)
    (src / "README").write_text("the task\n")
    store = str(tmp_path / "store")
    run = CliRunner().invoke
    built = run(app, ["template", "build", "task", "--from-dir", str(tmp_path / "src"), "--store", store])
    assert built.exit_code == 0, built.stderr
    assert run(app, ["template", "ls", "--store", store]).stdout.startswith("task  ")
    monkeypatch.setenv("CADENCE_TEMPLATE_DIR", store)
    r = run(app, ["run", "--template", "task", "--", "cat", "/task/README"])
    assert r.exit_code == 0 and r.stdout == "the task\n"
    assert run(app, ["template", "rm", "task", "--store", store]).exit_code == 0
    assert run(app, ["template", "ls", "--store", store]).stdout == ""
    bad = run(app, ["template", "build", "x", "--store", store])
    assert bad.exit_code == 2 and "exactly one of" in bad.stderr


@pytest.mark.slow
@needs_bwrap
@needs_root
def test_a_debian_template_with_a_package_the_host_lacks(store):
    """mmdebstrap from Debian's mirrors (CI installs mmdebstrap and reaches them): cowsay is not
    on the host; the template's own python3 runs the agent, and its pip requirement imports."""
    assert not os.path.exists("/usr/games/cowsay")
    t = store.build_debian("cowsay", ["cowsay"], requirements=["six==1.16.0"])
    assert t.own_system and t.python == "/usr/bin/python3"
    assert store.build_debian("again", ["cowsay"], requirements=["six==1.16.0"]).key == t.key  # cached
    with LocalSandbox(Limits(wall_s=20), template=t) as sb:
        r = sb.exec("/usr/games/cowsay moo && cat /etc/debian_version")
        assert r.exit_code == 0 and "< moo >" in r.stdout, r.stderr
        assert sb.exec(code="import six, sys; print(six.__version__, sys.executable)").stdout == "1.16.0 /usr/bin/python3\n"
        assert sb.exec("test -e /opt/python || test -e /usr/bin/gdb").exit_code == 1  # nothing of the host's


@needs_bwrap
@needs_root
def test_the_pool_keeps_warm_spares_per_template(files_template, store, monkeypatch):
    from cadence.sandbox.pool import Pool, PoolConfig
    from tests.sandbox.test_pool import wait_for

    monkeypatch.setenv("CADENCE_TEMPLATE_DIR", store.path)
    with Pool(PoolConfig(warm=1, templates={"files": 1}, health_period_s=3600, limits=Limits(wall_s=10))) as pool:
        def ready(template):
            return sum(s.state == "ready" and s.template == template for s in pool.list())
        wait_for(lambda: ready("files") == 1 and ready(None) == 1, "a spare on the host's root and one on the template")
        leased = pool.acquire(template="files")
        assert leased.template == "files" and leased.last_reason == "acquired (warm spare)"
        r = pool.exec(leased.id, ExecRequest(cmd="cat /data/only-here.txt"))
        assert r.stdout == "from the template\n"
        plain = pool.acquire()
        assert plain.template is None and pool.exec(plain.id, ExecRequest(cmd="test -e /data")).exit_code == 1
        wait_for(lambda: ready("files") == 1, "the template's spare refilled")


TASK_ENV = '''
class ReadTask:
    """One turn: the observation is a file only the template has; the right answer pays 1."""
    def reset(self, seed):
        return open("/data/only-here.txt").read(), {}

    def step(self, action):
        return "done", float(action == "ok"), True, False, {}
'''


@needs_bwrap
@needs_root
def test_the_service_and_a_hosted_env_start_on_a_template(files_template, store, tmp_path, monkeypatch):
    from cadence.sandbox.client import Sandbox
    from cadence.sandbox.hosted_env import HostedEnv
    from tests.sandbox.service import running_service

    monkeypatch.setenv("CADENCE_TEMPLATE_DIR", store.path)  # the service (a subprocess) inherits it
    with running_service(str(tmp_path), "--warm", "0") as (url, token, _):
        with Sandbox(url, token, template="files") as sb:
            assert sb.exec("cat /data/only-here.txt").stdout == "from the template\n"
        with pytest.raises(SandboxError, match="template name"):
            Sandbox(url, token, template="../../etc").start()
        env = HostedEnv(url, token, source=TASK_ENV, class_name="ReadTask", template="files").start()
        try:
            assert env.reset(0)[0] == "from the template\n"
            assert env.step("ok")[1] == 1.0
        finally:
            env.close()


def test_serve_keeps_warm_spares_per_template_from_the_command_line(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from cadence.sandbox import server
    from cadence.sandbox.cli import app

    seen = {}
    monkeypatch.setattr(server, "serve", lambda cfg, *a: seen.update(cfg=cfg))
    events = ["--events", str(tmp_path / "e.db")]
    r = CliRunner().invoke(app, ["serve", "--template-warm", "sci=4", "--template-warm", "web=1", *events])
    assert r.exit_code == 0 and seen["cfg"].templates == {"sci": 4, "web": 1}
    bad = CliRunner().invoke(app, ["serve", "--template-warm", "sci", *events])
    assert bad.exit_code == 2 and "give NAME=N" in bad.stderr


@needs_bwrap
@needs_root
def test_the_code_environment_runs_on_a_template(files_template, store, monkeypatch):
    from cadence.envs.code_env import CodeEnv

    monkeypatch.setenv("CADENCE_TEMPLATE_DIR", store.path)
    env = CodeEnv(backend="sandbox", template="files")
    try:
        r = env.executor.run("print(open('/data/only-here.txt').read(), end='')", 10.0)
        assert (r.stdout, r.exit_code) == ("from the template\n", 0)
    finally:
        env.executor.close()
    with pytest.raises(ValueError, match="need backend='sandbox'"):
        CodeEnv(backend="subprocess", template="files")
