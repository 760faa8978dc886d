"""Running model-written Python: a small `Executor` interface and a guarded-subprocess one.

`CodeEnv` only needs ``run(code, timeout_s) -> ExecResult``, so the sandbox
service (isolated instances with health checks) can stand in for
`SubprocessExecutor` (code_env.py's `EXECUTORS` names both).

`SubprocessExecutor` is a guard, not a security boundary: a fresh interpreter
in isolated mode (``-I``: no user site, no PYTHON* variables), an empty
temporary working folder, a bare environment, no stdin, limits on address
space, CPU seconds, output size and open files, a wall-clock timeout that kills
the whole process group, and output written to files (a print loop cannot fill
the parent's memory). It does not stop code from reading the filesystem or
using the network; use the sandbox backend for that.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass
class ExecResult:
    stdout: str
    stderr: str
    exit_code: int | None  # None when killed for the timeout
    timed_out: bool = False


class Executor(Protocol):
    def run(self, code: str, timeout_s: float) -> ExecResult: ...


# Sets the limits inside the child, then runs the code as __main__: no preexec_fn, which
# is unsafe to use from a process that has threads (the runner's worker is one).
_BOOTSTRAP = """\
import resource, sys
def _limit(kind, value):
    try:
        resource.setrlimit(kind, (value, value))
    except (ValueError, OSError):
        pass
_limit(resource.RLIMIT_AS, {memory_bytes})
_limit(resource.RLIMIT_CPU, {cpu_s})
_limit(resource.RLIMIT_FSIZE, {output_bytes})
_limit(resource.RLIMIT_NOFILE, 64)
_limit(resource.RLIMIT_CORE, 0)
del _limit, resource
_source = open("main.py").read()
exec(compile(_source, "main.py", "exec"), {{"__name__": "__main__"}})
"""


_BOOTSTRAP_FRAME = re.compile(r'  File "<string>", line \d+, in <module>\n')  # ours, not theirs


class SubprocessExecutor:
    """Python in a limited child process (see the module docstring)."""

    def __init__(self, memory_mb: int = 512, output_bytes: int = 1 << 20) -> None:
        self.memory_mb = memory_mb
        self.output_bytes = output_bytes

    def run(self, code: str, timeout_s: float) -> ExecResult:
        with tempfile.TemporaryDirectory(prefix="cadence-exec-") as folder:
            work = Path(folder)
            (work / "main.py").write_text(code)
            bootstrap = _BOOTSTRAP.format(
                memory_bytes=self.memory_mb << 20,
                cpu_s=int(timeout_s) + 1,
                output_bytes=self.output_bytes,
            )
            env = {"PATH": "/usr/bin:/bin", "HOME": folder, "LANG": "C.UTF-8"}
            if "LD_LIBRARY_PATH" in os.environ:  # a relocated interpreter (in a sandbox) finds its libpython by it
                env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
            with open(work / "out", "wb") as out, open(work / "err", "wb") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-c", bootstrap],
                    cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                    start_new_session=True,
                )  # fmt: skip
                try:
                    exit_code: int | None = proc.wait(timeout=timeout_s)
                    timed_out = False
                except subprocess.TimeoutExpired:
                    exit_code, timed_out = None, True
                finally:
                    # The code may have started children of its own: end the whole group.
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                    proc.wait()
            stdout = (work / "out").read_bytes().decode("utf-8", "replace")
            stderr = (work / "err").read_bytes().decode("utf-8", "replace")
            return ExecResult(stdout, _BOOTSTRAP_FRAME.sub("", stderr), exit_code, timed_out)
