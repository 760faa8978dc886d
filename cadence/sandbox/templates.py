"""Templates: named, cached root file systems a sandbox can start from instead of the host's.

A template is built once from a folder, an OCI image archive (`docker save`, or an OCI layout;
template_layers.py unpacks it without a daemon) or Debian packages (`mmdebstrap`) plus pip
requirements, and stored read-only under a content key: the same recipe is built once, and
several names may share it. Store layout (default ~/.cadence/sandbox/templates, or
$CADENCE_TEMPLATE_DIR): `objects/<key>/rootfs` and `objects/<key>/template.json`, and
`names/<name>.json` naming a key.

Two kinds of root, told apart at build time:
- with its own system (a python3 at usr/local/bin or usr/bin, e.g. a Debian or python image):
  the sandbox sees the template's /usr, not the host's, and its python3 runs the agent;
- files only (no usr/, bin/, lib*/): the host's system view (system_view.py) and Python are
  shown over it, as in a sandbox without a template.

A sandbox on a template (template_root.py) sees the template's root through a copy-on-write layer
of its own (overlayfs), so writes never reach the template.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import resource
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from cadence.sandbox import staging
from cadence.sandbox.models import SandboxError
from cadence.sandbox.template_layers import Budget, LayerError, UnpackLimits, unpack_image

DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".cadence", "sandbox", "templates")
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
PYTHONS = ("usr/local/bin/python3", "usr/bin/python3")  # where a template's own python3 may be
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib64", "lib32")  # the host's cover these without one
DEBIAN_SUITE = "bookworm"
MNT_DETACH = 2
# The agent's bytecode magic, site folders and python version, printed by the template's python3.
PROBE = ("import importlib.util,json,site,sys;print(json.dumps([importlib.util.MAGIC_NUMBER.hex(),"
         "[p for p in site.getsitepackages()],sys.version.split()[0]]))")
# The probe runs the image's own python3 (untrusted code) on the host: what it may take.
PROBE_TIMEOUT_S = 60
PROBE_OUTPUT = 1 << 20  # bytes of stdout, of stderr, of any file it writes (RLIMIT_FSIZE); its answer is a line
PROBE_MEMORY = 1 << 30  # address space per process (RLIMIT_AS)


class TemplateError(SandboxError):
    """A template that cannot be built, found or used (the message names the fix)."""


@dataclass(frozen=True)
class Template:
    name: str
    key: str
    root: str  # the read-only root file system on the host
    source: str  # what it was built from, for `ls`
    python: str | None  # its own python3 (a path inside), None: the host's system and Python
    magic: str | None  # that python's bytecode magic (hex)
    site_dirs: tuple[str, ...]  # that python's site-packages (inside paths)
    size_mb: float
    created: float

    @property
    def own_system(self) -> bool:
        return self.python is not None


class TemplateStore:
    """`unpack`: what building from an image or a folder may write (an untrusted image could
    expand without end)."""

    def __init__(self, path: str | None = None, unpack: UnpackLimits | None = None) -> None:
        self.path = os.path.abspath(path or os.environ.get("CADENCE_TEMPLATE_DIR") or DEFAULT_DIR)
        self.unpack = unpack or UnpackLimits()
        for sub in ("objects", "names"):
            os.makedirs(os.path.join(self.path, sub), exist_ok=True)

    # -- build -----------------------------------------------------------------------------------
    def build_from_dir(self, name: str, folder: str) -> Template:
        """A template holding a copy of `folder` (its symlinks kept as links; fifos, devices and
        sockets refused), within the store's `unpack` limits."""
        if not os.path.isdir(folder):
            raise TemplateError(f"template {name!r}: --from-dir {folder!r} is not a folder")
        return self._build(name, "dir:" + _tree_digest(folder), f"dir {os.path.abspath(folder)}",
                           lambda root: _copy_folder(folder, root, Budget(self.unpack)))

    def build_from_image(self, name: str, image: str) -> Template:
        """A template from an OCI image archive: `docker save` output or an OCI layout (folder or tar)."""
        if not os.path.exists(image):
            raise TemplateError(f"template {name!r}: image {image!r} does not exist; give a `docker save` tar or an OCI layout")
        digest = _tree_digest(image) if os.path.isdir(image) else _file_digest(image)
        return self._build(name, "image:" + digest, f"image {os.path.abspath(image)}",
                           lambda root: unpack_image(image, root, self.unpack))

    def build_debian(self, name: str, packages: list[str], requirements: list[str] = (),
                     suite: str = DEBIAN_SUITE, mirror: str | None = None) -> Template:
        """A Debian root (mmdebstrap, variant essential) with python3, `packages` and pip `requirements`."""
        if shutil.which("mmdebstrap") is None:
            raise TemplateError("building from Debian packages needs mmdebstrap: apt-get install mmdebstrap")
        pkgs = sorted({"python3", *packages, *(["python3-pip"] if requirements else [])})
        recipe = json.dumps({"suite": suite, "mirror": mirror, "packages": pkgs, "pip": sorted(requirements)})
        return self._build(name, "debian:" + hashlib.sha256(recipe.encode()).hexdigest(),
                           f"debian {suite} {' '.join(pkgs)}" + (f" pip {' '.join(requirements)}" if requirements else ""),
                           lambda root: _mmdebstrap(root, suite, pkgs, list(requirements), mirror))

    def _build(self, name: str, recipe: str, source: str, fill: Callable[[str], object]) -> Template:
        _check_name(name)
        key = hashlib.sha256(recipe.encode()).hexdigest()[:20]
        obj = os.path.join(self.path, "objects", key)
        if not os.path.exists(os.path.join(obj, "template.json")):  # built once per recipe
            tmp = tempfile.mkdtemp(prefix=f".build-{key}-", dir=os.path.join(self.path, "objects"))
            try:
                root = os.path.join(tmp, "rootfs")
                os.mkdir(root, 0o755)
                fill(root)
                _detach_mounts(tmp)
                os.chmod(root, 0o755)
                meta = {"key": key, "source": source, "created": time.time(), "size_mb": _size_mb(root),
                        **_probe_python(root, name)}
                with open(os.path.join(tmp, "template.json"), "w") as f:
                    json.dump(meta, f)
                os.chmod(tmp, 0o755)
                try:
                    os.rename(tmp, obj)
                except OSError:  # built by another process meanwhile: keep theirs
                    pass
            except LayerError as e:
                raise TemplateError(f"template {name!r}: {e}") from e
            finally:
                _detach_mounts(tmp)
                shutil.rmtree(tmp, ignore_errors=True)
        _write_atomic(os.path.join(self.path, "names", f"{name}.json"), json.dumps({"key": key}))
        return self.get(name)

    # -- look up -----------------------------------------------------------------------------------
    def get(self, name: str) -> Template:
        _check_name(name)  # a client's name: never a path
        try:
            with open(os.path.join(self.path, "names", f"{name}.json")) as f:
                key = json.load(f)["key"]
            with open(os.path.join(self.path, "objects", key, "template.json")) as f:
                meta = json.load(f)
        except (OSError, ValueError, KeyError) as e:
            raise TemplateError(f"template {name!r}: not in {self.path} (`cadence sandbox template ls`; "
                                "build it with `cadence sandbox template build`)") from e
        return Template(name=name, key=key, root=os.path.join(self.path, "objects", key, "rootfs"),
                        source=meta["source"], python=meta["python"], magic=meta["magic"],
                        site_dirs=tuple(meta["site_dirs"]), size_mb=meta["size_mb"], created=meta["created"])

    def ls(self) -> list[Template]:
        names = sorted(n[:-5] for n in os.listdir(os.path.join(self.path, "names")) if n.endswith(".json"))
        out = []
        for n in names:
            try:
                out.append(self.get(n))
            except TemplateError:
                continue  # a name whose object was removed by hand
        return out

    def rm(self, name: str) -> None:
        """Forget `name`; its files go when no other name uses them. Sandboxes running on it keep
        running only until their files are gone: remove a template nobody runs."""
        key = self.get(name).key
        os.unlink(os.path.join(self.path, "names", f"{name}.json"))
        if all(t.key != key for t in self.ls()):
            shutil.rmtree(os.path.join(self.path, "objects", key), ignore_errors=True)


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not NAME.match(name):
        raise TemplateError(f"template name {name!r}: use 1-64 of a-z 0-9 . _ - (starting with a letter or digit)")


def resolve(template: str | Template | None, store: TemplateStore | None = None) -> Template | None:
    """A Template from a name (looked up in the store), a Template, or None."""
    if template is None or isinstance(template, Template):
        return template
    return (store or TemplateStore()).get(template)


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _tree_digest(folder: str) -> str:
    """A digest of a folder's names, types, modes, sizes, mtimes and link targets (not contents:
    an edited file changes its mtime)."""
    h = hashlib.sha256()
    for dirpath, dirs, files in os.walk(folder):
        dirs.sort()
        for n in sorted(dirs + files):
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            link = os.readlink(p) if os.path.islink(p) else ""
            h.update(f"{os.path.relpath(p, folder)}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0{link}\n".encode())
    return h.hexdigest()


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _copy_folder(folder: str, root: str, budget: Budget) -> None:
    """Copy `folder` into `root`: symlinks as links, regular files counted against `budget`. A
    device or fifo is refused: copied as a file, /dev/zero-like nodes never end."""
    def count(where: str, names: list[str]) -> set[str]:  # copytree shows each folder's names here once
        for n in names:
            budget.entry(os.path.join(where, n))
        return set()

    def copy(src: str, dst: str) -> None:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise LayerError(f"{src!r}: a fifo, device or socket, refused (a template holds files, folders and links)")
            with open(dst, "wb") as out:
                budget.copy(src, f, out)
        shutil.copystat(src, dst, follow_symlinks=False)
        os.chmod(dst, st.st_mode & 0o1777)  # no setuid/setgid, as from an image

    try:
        shutil.copytree(folder, root, symlinks=True, ignore=count, copy_function=copy, dirs_exist_ok=True)
    except shutil.Error as e:  # copytree gathers the OSErrors of every file
        src, _, why = e.args[0][0]
        raise LayerError(f"{src!r}: cannot be copied ({why}); {len(e.args[0])} error(s) in all") from e


def _detach_mounts(folder: str) -> None:
    """Detach whatever is mounted under `folder`, deepest first: a failed mmdebstrap can leave its
    new root's /proc mounted, which then outlives the build (and rmtree would walk into it)."""
    with open("/proc/self/mountinfo") as f:  # field 5: the mount point, with \ooo escapes
        points = [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4]) for line in f]
    for point in sorted((p for p in points if p.startswith(folder + "/")), key=len, reverse=True):
        try:
            staging._libc_call("umount2", point.encode(), MNT_DETACH)
        except OSError:
            pass  # not ours to detach (no CAP_SYS_ADMIN): rmtree then leaves it


def _size_mb(root: str) -> float:
    total = sum(os.lstat(os.path.join(d, f)).st_size for d, _, fs in os.walk(root) for f in fs)
    return round(total / (1 << 20), 1)


def _probe_python(root: str, name: str) -> dict:
    """The template's own python3 (its magic and site folders, asked of it inside the root), or
    none: then it must leave the system folders to the host's view."""
    python = next((p for p in PYTHONS if os.path.lexists(os.path.join(root, p))), None)
    if python is None:
        present = [d for d in SYSTEM_DIRS if os.path.lexists(os.path.join(root, d))]
        if present:
            raise TemplateError(
                f"template {name!r}: has {', '.join(present)} but no python3 ({' or '.join(PYTHONS)}); a template "
                "with its own system needs a python3 to run the sandbox's agent: add python3 (or drop those folders "
                "to run on the host's system)")
        return {"python": None, "magic": None, "site_dirs": []}
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise TemplateError("building a template with its own system needs bubblewrap: apt-get install bubblewrap")
    argv = [bwrap, "--unshare-all", "--die-with-parent", "--clearenv", "--ro-bind", root, "/", "--proc", "/proc",
            "--dev", "/dev", "--size", str(PROBE_OUTPUT), "--tmpfs", "/tmp", "/" + python, "-I", "-c", PROBE]
    # Its output goes to files, not pipes: RLIMIT_FSIZE stops a flood at PROBE_OUTPUT (a pipe read
    # into host memory has no bound but the timeout).
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            code = subprocess.run(argv, stdout=out, stderr=err, timeout=PROBE_TIMEOUT_S, preexec_fn=_probe_limits).returncode
        except subprocess.TimeoutExpired as e:
            raise TemplateError(f"template {name!r}: its /{python} did not answer in {PROBE_TIMEOUT_S} s; a "
                                "template's python3 runs the sandbox's agent") from e
        if max(os.fstat(out.fileno()).st_size, os.fstat(err.fileno()).st_size) >= PROBE_OUTPUT:
            raise TemplateError(f"template {name!r}: its /{python} printed {PROBE_OUTPUT >> 20} MiB or more when "
                                "asked its version; refused (a template's python3 runs the sandbox's agent)")
        stdout, stderr = (_read_all(f) for f in (out, err))
    if code != 0:
        raise TemplateError(f"template {name!r}: its /{python} does not run ({' | '.join(stderr.strip()[-300:].splitlines())}); "
                            "a template's python3 runs the sandbox's agent")
    try:
        magic, sites, version = json.loads(stdout)
        if not (isinstance(magic, str) and isinstance(version, str) and isinstance(sites, list)
                and all(isinstance(d, str) and d.startswith("/") for d in sites)):
            raise ValueError("not [magic, [site folders], version]")
    except (ValueError, TypeError, RecursionError) as e:
        raise TemplateError(f"template {name!r}: its /{python} answered {stdout[:100]!r} when asked its version "
                            f"({e}); is it CPython 3?") from e
    return {"python": "/" + python, "magic": magic, "site_dirs": sites, "python_version": version}


def _probe_limits() -> None:
    """Run in the probe's child before bwrap starts (inherited by the template's python3)."""
    for what, value in ((resource.RLIMIT_FSIZE, PROBE_OUTPUT), (resource.RLIMIT_AS, PROBE_MEMORY),
                        (resource.RLIMIT_CPU, PROBE_TIMEOUT_S), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(what, (value, value))


def _read_all(f) -> str:
    f.seek(0)
    return f.read().decode(errors="replace")


def _mmdebstrap(root: str, suite: str, packages: list[str], requirements: list[str], mirror: str | None) -> None:
    argv = ["mmdebstrap", "--quiet", "--variant=essential", f"--include={','.join(packages)}",
            *(f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "locale"))]
    if requirements:
        req = os.path.join(tempfile.mkdtemp(prefix="cadence-template-"), "requirements.txt")
        with open(req, "w") as f:
            f.write("\n".join(requirements) + "\n")
        # The host's pip downloads binary wheels for the template's python (with the host's indexes,
        # proxy and CA settings, which the new root lacks); pip inside installs them offline.
        version = 'V=$(chroot "$1" python3 -c "import sys; print(\'%d.%d\' % sys.version_info[:2])")'
        download = (f'{sys.executable} -m pip download --quiet --only-binary=:all: --python-version "$V" '
                    f'--implementation cp --platform manylinux2014_{platform.machine()} '
                    f'-d "$1/tmp/cadence-wheels" -r {req}')
        argv += [f"--customize-hook={version} && {download}",
                 '--customize-hook=chroot "$1" python3 -m pip install --quiet --no-index --break-system-packages '
                 f"--find-links /tmp/cadence-wheels {' '.join(shlex.quote(r) for r in requirements)}",
                 '--customize-hook=rm -rf "$1/tmp/cadence-wheels"']
    argv += [suite, root, *([mirror] if mirror else [])]
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode != 0:
        raise TemplateError(f"mmdebstrap failed ({out.returncode}): {out.stderr.strip()[-800:]}")
