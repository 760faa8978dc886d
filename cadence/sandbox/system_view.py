"""What a sandbox sees of the host's system: /usr read-only, without debuggers and compilers.

The host's /usr is bound read-only (with the /bin, /lib, /lib64 links and the few /etc files
ld.so and /usr/bin links need). Its bin folders are shown without the tools that help code
attack the processes beside it or build native code: debuggers and tracers (gdb, strace, ltrace,
perf, valgrind), compilers, assemblers and linkers (gcc, g++, cc, clang, tcc, as, ld, llvm-*),
and the folders holding their back ends (/usr/lib/gcc, /usr/lib/llvm-*, ...). That is depth,
not the boundary: the seccomp filter (seccomp.py) and the non-dumpable agent are what stop
ptrace and friends, whatever binary asks. `dev_tools=True` shows /usr whole.

Cheap at every start: each bin folder is replaced by one bind of a mirror made once per host
state (hard links to every allowed file, its symlinks copied), in staging.VIEWS. Where hard
links cannot be made (another file system), the denied files are covered one by one instead
(one mount each: slower starts).
"""

from __future__ import annotations

import functools
import glob
import hashlib
import os
import re
import shutil
import tempfile

from cadence.sandbox import staging

DENIED_TOOL = re.compile(
    r"^(gdb.*|gcore|gdbserver|lldb.*|strace.*|ltrace|perf|valgrind.*|vgdb|pldd"
    r"|(.+-)?(gcc|g\+\+|cc|c\+\+|cpp|clang|clang\+\+|tcc|as|ld|ld\.bfd|ld\.gold|gold|objdump|objcopy|gfortran)"
    r"(-[0-9.]+)?|c89(-gcc)?|c99(-gcc)?|llvm-.*|lli(-.*)?|llc(-.*)?|rustc|cargo|go|nasm|yasm)$"
)
BIN_DIRS = ("/usr/bin", "/usr/local/bin")
BACKEND_DIRS = ("/usr/lib/gcc", "/usr/libexec/gcc", "/usr/lib/llvm-*", "/usr/libexec/valgrind", "/usr/lib/valgrind")


def full_view() -> list[str]:
    """Read-only /usr and what merged-/usr systems link into it; a few files ld.so and /usr/bin
    links need from /etc."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/lib", "/lib64", "/lib32", "/bin", "/sbin"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for path in ("/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime"):
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def system_view(dev_tools: bool = False, keep: tuple[str, ...] = ()) -> list[str]:
    """bwrap arguments for the system view; `keep`: paths that must stay (the sandbox's Python)."""
    if dev_tools:
        return full_view()
    return full_view() + _without_tools(keep)


@functools.lru_cache(maxsize=4)
def _without_tools(keep: tuple[str, ...]) -> list[str]:
    args: list[str] = []
    for folder in BIN_DIRS:
        if not os.path.isdir(folder) or os.path.islink(folder):
            continue
        denied = [n for n in os.listdir(folder) if _denied(folder, n) and os.path.join(folder, n) not in keep]
        if not denied:
            continue
        mirror = _mirror(folder, set(denied))
        if mirror is not None:
            args += ["--ro-bind", mirror, folder]
        else:  # no hard links here: cover each denied file (regular files only; links then dangle)
            for name in denied:
                path = os.path.join(folder, name)
                if os.path.isfile(path) and not os.path.islink(path):
                    args += ["--ro-bind", "/dev/null", path]
    for pattern in BACKEND_DIRS:
        for folder in sorted(glob.glob(pattern)):
            if os.path.isdir(folder) and not any(k.startswith(folder + "/") for k in keep):
                args += ["--tmpfs", folder]
    return args


def _denied(folder: str, name: str) -> bool:
    """A denied name, or a link to one (cc -> /etc/alternatives/cc -> gcc-12)."""
    if DENIED_TOOL.match(name):
        return True
    path = os.path.join(folder, name)
    return os.path.islink(path) and bool(DENIED_TOOL.match(os.path.basename(os.path.realpath(path))))


def _mirror(folder: str, denied: set[str]) -> str | None:
    """A folder with hard links to everything in `folder` but `denied` (made once per state of
    `folder`: its mtime changes whenever an entry is added, removed or replaced), or None where
    hard links cannot be made."""
    st = os.stat(folder)
    key = hashlib.sha256(f"{folder}:{st.st_ino}:{st.st_mtime_ns}:{sorted(denied)}".encode()).hexdigest()[:16]
    target = os.path.join(staging.root(staging.VIEWS), f"bin-{key}")
    if os.path.isdir(target):
        return target
    tmp = tempfile.mkdtemp(prefix=f".bin-{key}-", dir=staging.root(staging.VIEWS))
    try:
        for name in os.listdir(folder):
            if name in denied:
                continue
            src, dst = os.path.join(folder, name), os.path.join(tmp, name)
            if os.path.islink(src):
                os.symlink(os.readlink(src), dst)
            elif os.path.isfile(src):
                os.link(src, dst)
        os.chmod(tmp, 0o755)
        os.rename(tmp, target)
    except OSError:
        pass  # no hard links on this file system, or another process made it first
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target if os.path.isdir(target) else None
