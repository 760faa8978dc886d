"""`reward.name=unit_tests`: run the model's code against the task's tests, in a sandbox.

A task row carries its tests in a field (`reward.unit_tests.tests_field`, default ``tests``): a
JSON list of Python snippets, each one test, run after the solution in the solution's
namespace; a test passes when it runs to the end without raising, e.g.

    {"prompt": "Write add(a, b).", "answer": "", "tests": ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]}

The solution is the last fenced code block of the response (```python ... ```), or the whole
response when it has none. Score (`scoring`):

    fraction:  passed / total        (partial credit, the default)
    all:       1.0 if passed == total else 0.0

Where it runs: a fresh sandbox per response (cadence.sandbox: no network, no host files,
rlimits, a seccomp filter and, where available, a memory cgroup), on a sandbox service when
`url` is set (a warm sandbox from its pool: milliseconds) or a local bubblewrap sandbox
otherwise. Inside, a judge (cadence/rewards/judge/, at the sandbox agent's uid) runs each test
itself and the solution as user code (its own uid, where the host is root), in a fresh process
per test (forked from one interpreter per call) that only answers its questions ("call add(2,
3)") with plain data of exact built-in types; the judge compares, so an always-equal object, an
early exit, patched builtins or a printed verdict fail the test, and a test that runs out of
time scores the whole solution 0. The tests and the per-call nonce never enter the solution's
process (there is no tests file), and the host counts the judge's verdict line only when it
carries that nonce and the call exited 0 within its limits: model code can at most spoil a run
(where it shares the judge's uid: the response then scores 0.0), never forge one. See
docs/sandbox.md, "Reward hacks and the defence that stops each".
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from cadence.data.tasks import Prompt
from cadence.rewards.judge import JUDGE

MAX_TESTS = 245  # a bound on one response's sandbox time (test_timeout_s each)

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


class UnitTestsConfig(BaseModel):
    """Settings of the `unit_tests` reward (`reward.unit_tests.*`)."""

    model_config = ConfigDict(extra="forbid")

    tests_field: str = Field("tests", description="Task row field holding the list of test snippets.")
    scoring: Literal["fraction", "all"] = Field(
        "fraction", description="'fraction': share of tests passed; 'all': 1.0 only if every test passes."
    )
    test_timeout_s: float = Field(2.0, gt=0, description="Wall clock per test (solution + test).")
    memory_mb: int = Field(
        512, ge=64, description="Memory of a local sandbox (per process; in all where cgroups allow); "
        "on a service, the service's limits apply."
    )
    url: str | None = Field(
        None, description="Sandbox service URL (`cadence sandbox serve`); None: a local bubblewrap sandbox."
    )
    python_packages: Literal["site", "none"] = Field(
        "site", description="A local sandbox's Python: 'site' (the interpreter's packages, e.g. numpy, importable "
        "read-only) or 'none' (standard library only); on a service, the service's setting applies."
    )


def extract_code(response: str) -> str:
    """The last fenced code block of `response`, or all of it when there is none."""
    blocks = _FENCE.findall(response)
    return blocks[-1] if blocks else response


def tests_of(prompt: Prompt, field: str) -> list[str]:
    """The prompt's tests; ValueError naming the prompt and the field when they are unusable."""
    tests = prompt.meta.get(field)
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        got = "missing" if tests is None else f"a {type(tests).__name__}"
        raise ValueError(f"prompt {prompt.id}: field {field!r} must be a non-empty list of test snippets "
                         f"(strings), got {got}; set reward.unit_tests.tests_field to the task's tests field")
    if len(tests) > MAX_TESTS:
        raise ValueError(f"prompt {prompt.id}: {len(tests)} tests; at most {MAX_TESTS} per prompt")
    return tests


class UnitTestReward:
    """fn(prompt, response) -> score, see the module docstring. Pickles as its config."""

    def __init__(self, cfg: UnitTestsConfig) -> None:
        self.cfg = cfg
        self._check_backend()

    def _check_backend(self) -> None:
        """Fail at build time, with the fix, rather than score every response 0.0."""
        from cadence.sandbox.models import SandboxError

        if self.cfg.url is None:
            if shutil.which("bwrap") is None:
                raise ValueError("reward.name 'unit_tests' runs model code in a sandbox: install bubblewrap "
                                 "(apt-get install bubblewrap) or set reward.unit_tests.url to a sandbox service")
            return
        import httpx

        from cadence.sandbox.client import resolve

        try:
            urls, token = resolve(self.cfg.url, None)
            r = httpx.get(f"{urls[0]}/v1/health", headers={"Authorization": f"Bearer {token}"}, timeout=5)
        except (SandboxError, httpx.HTTPError) as e:
            raise ValueError(f"reward.unit_tests.url {self.cfg.url!r}: no sandbox service answers "
                             f"({type(e).__name__}: {e}); start one with `cadence sandbox serve`") from None
        if r.status_code != 200:
            raise ValueError(f"reward.unit_tests.url {self.cfg.url!r}: the service answered {r.status_code} "
                             "(a wrong token? set CADENCE_SANDBOX_TOKEN or CADENCE_SANDBOX_TOKEN_FILE)")

    def __getstate__(self) -> dict[str, Any]:
        return {"cfg": self.cfg}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.cfg = state["cfg"]

    def __call__(self, prompt: Prompt, response: str) -> float:
        tests = tests_of(prompt, self.cfg.tests_field)
        passed = self.run(extract_code(response), tests)
        if self.cfg.scoring == "all":
            return float(passed == len(tests))
        return passed / len(tests)

    def run(self, solution: str, tests: list[str]) -> int:
        """How many of `tests` pass against `solution`, in a fresh sandbox."""
        from cadence.sandbox.models import Limits

        wall = self.cfg.test_timeout_s * len(tests) + 5.0
        if self.cfg.url is not None:
            from cadence.sandbox.client import Sandbox

            with Sandbox(self.cfg.url) as sb:  # the service's limits: a warm spare, no cold start
                return passed_tests(sb, solution, tests, self.cfg.test_timeout_s, wall)
        from cadence.sandbox.sandbox import LocalSandbox

        limits = Limits(memory_mb=self.cfg.memory_mb, processes=64, wall_s=wall, cpu_s=wall)
        with LocalSandbox(limits, python_packages=self.cfg.python_packages) as sb:
            return passed_tests(sb, solution, tests, self.cfg.test_timeout_s, wall)


def passed_tests(sb: Any, solution: str, tests: list[str], test_timeout_s: float, wall_s: float) -> int:
    """Run the judge in sandbox `sb` (local or a service's) at the agent's uid (`judge=True`: the
    solution runs as user code, which cannot reach it) and read its verdict: only a line carrying
    this call's nonce, from a judge that exited 0 within its limits, counts. A test that ran out
    of time makes it 0 passed: time spent never buys a partial result (a judge's "time limit
    exceeded" for the whole solution)."""
    nonce = secrets.token_hex(16)
    params = json.dumps({"tests": tests, "solution": solution, "timeout_s": test_timeout_s, "nonce": nonce})
    r = sb.exec(code=f"PARAMS = {params!r}\n{JUDGE}", timeout_s=wall_s, judge=True)
    lines = r.stdout.splitlines()
    verdict = lines[-1].split(" ") if lines else []
    if (r.limit is not None or r.exit_code != 0 or len(verdict) != 3 or verdict[0] != nonce
            or not all(v.isdigit() for v in verdict[1:]) or int(verdict[1]) + int(verdict[2]) > len(tests)):
        # The judge was killed (by a limit, or by model code where it shares the judge's uid):
        # nothing it counted can be trusted.
        raise RuntimeError(f"unit-test harness failed: exit {r.exit_code}, limit {r.limit}, {r.stderr[-200:]!r}")
    passed, timed_out = int(verdict[1]), int(verdict[2])
    return 0 if timed_out else passed
