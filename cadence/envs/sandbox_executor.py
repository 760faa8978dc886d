"""The code environment's executor, isolated: model-written Python runs in a sandbox.

`cadence.envs.code_env.CodeEnv` needs `run(code, timeout_s) -> ExecResult`; this one runs each
snippet as a fresh fork of the sandbox's Python (its own globals; files in /workspace persist
for the executor's lifetime), in one bubblewrap sandbox per executor started on first use, or on
a sandbox service when given `url`. A sandbox that dies is replaced and the snippet run once
more (a snippet has no state to lose). It is the `sandbox` backend of the code environment:
`CodeEnv(backend="sandbox")`, or `env.kwargs.backend=sandbox` in a config.
"""

from __future__ import annotations

import weakref

from cadence.envs.executor import ExecResult
from cadence.sandbox.models import Limits, SandboxDied
from cadence.sandbox.sandbox import LocalSandbox


class SandboxExecutor:
    def __init__(self, memory_mb: int = 512, processes: int = 64, url: str | list[str] | None = None,
                 token: str | None = None, allow_unisolated: bool = False, python_packages: str = "site",
                 template: str | None = None) -> None:
        """`python_packages`: a local sandbox's ("site": the interpreter's packages; "none": the
        standard library only); a service's own setting applies to its sandboxes. `template`: a
        template's name (cadence/sandbox/templates.py): the sandbox's root file system."""
        self.limits = Limits(memory_mb=memory_mb, processes=processes)
        self.url, self.token, self.allow_unisolated = url, token, allow_unisolated
        self.python_packages = python_packages
        self.template = template
        self._box = None
        self._finalizer = None

    def _sandbox(self):
        if self._box is None:
            if self.url is not None:
                from cadence.sandbox.client import Sandbox

                self._box = Sandbox(self.url, self.token, limits=self.limits, template=self.template).start()
                self._finalizer = weakref.finalize(self, self._box.close)
            else:
                self._box = LocalSandbox(self.limits, allow_unisolated=self.allow_unisolated,
                                         python_packages=self.python_packages, template=self.template).start()
                self._finalizer = weakref.finalize(self, self._box.stop)
        return self._box

    def run(self, code: str, timeout_s: float) -> ExecResult:
        for attempt in range(2):
            try:
                r = self._sandbox().exec(code=code, timeout_s=timeout_s)
                break
            except SandboxDied:
                self.close()
                if attempt == 1:
                    raise
        if r.limit == "wall":
            return ExecResult(r.stdout, r.stderr, None, timed_out=True)
        return ExecResult(r.stdout, r.stderr, r.exit_code)

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self._box = self._finalizer = None

