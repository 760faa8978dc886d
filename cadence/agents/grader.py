"""Grading a run where the agent cannot reach: its changes, applied to a fresh copy of the task's
start, judged by the task's hidden tests.

    changes = workspace_changes(group.pristine, await sandbox.snapshot(), protected, outputs)
    report = await grader.grade(group, row, changes)        # after the run's sandbox is released
    reward = grader.score(report)

1. The run's changes are the difference between its workspace at the end (a tar read with every
   process of its sandbox stopped) and the task's prepared state: regular files written or
   deleted. Changes under protected paths (tests, conftest.py, the runner's config, `.pth` and
   `*customize.py` files; `agent.grader.protected` plus the row's own) are not carried, so those
   are graded as the task had them; nor are symbolic links (a link the agent made is a file it
   did not write); with `outputs`, only those paths are carried.
2. They are applied to a fresh sandbox holding a copy of the group's prepared state (a sandbox
   no agent touched), after the run's own sandbox was stopped: nothing the agent left running
   reaches it.
3. The hidden tests (never in the task the agent gets, never in any workspace) run there with
   the unit-test judge (cadence/rewards/judge/): the repository's code runs as user
   code in a worker per test that answers the judge's questions; the judge compares, at another
   uid. The worker imports the repository from /workspace with `-I -S` (no site, no `.pth`, no
   `sitecustomize`), starts from the judge's own interpreter path (no PATH lookup), and the judge's
   import path holds no workspace folder.

Reward: with report = {passed, total, error}

    fraction:  passed / total
    all:       1.0 if passed == total else 0.0
    python:module:function   function(report) -> float

A test out of time, a judge killed by a limit, changes over `max_changes_mb` or a workspace that
cannot be applied all score 0.0 (report["error"] says why). A grading whose sandbox dies under the
judge (killed, replaced: no verdict, through no fault of the run) runs again in a fresh copy, and
raises SandboxDied when that one dies too, so the run is lost and replayed rather than scored.
"""

from __future__ import annotations

import asyncio
import fnmatch
import io
import posixpath
import tarfile
from dataclasses import dataclass, field
from typing import Any

from cadence.agents.config import GraderConfig
from cadence.agents.task_sandbox import TaskGroup
from cadence.python_spec import load_python_object
from cadence.rewards.unit_tests import passed_tests
from cadence.sandbox import workspace
from cadence.sandbox.isolation import WORKSPACE
from cadence.sandbox.models import ExecRequest, ExecResult, SandboxDied, SandboxError
from cadence.sandbox.pool import Pool

GRADE_TRIES = 2  # fresh copies for one grading whose sandbox died under the judge (not the code's doing:
# a limit the code hit is a result, the sandbox lives on)
# The judge's imports never come from the workspace (a `select.py` there would run in the judge).
JUDGE_PATH = "import sys\nsys.path[:] = [p for p in sys.path if p not in ('', '.', '/workspace')]\n"
# The worker's: the repository first.
WORKER_PATH = f"import sys\nsys.path.insert(0, {WORKSPACE!r})\n"


@dataclass
class Changes:
    """A run's changes to carry to grading, and what was left behind (path -> why)."""

    written: dict[str, bytes] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(len(data) for data in self.written.values())


def matches(path: str, patterns: list[str]) -> bool:
    """As .gitignore: a pattern without '/' matches any component of the path (so a folder name
    covers what is under it), one with '/' the path from the root or a folder above it."""
    parts = path.split("/")
    for pattern in patterns:
        pattern = pattern.strip("/")
        if "/" not in pattern:
            if any(fnmatch.fnmatchcase(part, pattern) for part in parts):
                return True
        elif any(fnmatch.fnmatchcase("/".join(parts[:i]), pattern) for i in range(1, len(parts) + 1)):
            return True
    return False


def tar_entries(data: bytes) -> dict[str, tuple[str, bytes]]:
    """path -> (kind, content) of a workspace tar: 'file' with its bytes, 'link' with its target;
    folders are implied by their files."""
    out: dict[str, tuple[str, bytes]] = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar:
            path = posixpath.normpath(member.name)
            if member.isfile():
                f = tar.extractfile(member)
                out[path] = ("file", f.read() if f is not None else b"")
            elif member.issym() or member.islnk():
                out[path] = ("link", member.linkname.encode())
    return out


def workspace_changes(pristine: bytes, after: bytes, protected: list[str], outputs: list[str] | None = None) -> Changes:
    """What the run changed in its workspace, as files to write and paths to delete."""
    before, now = tar_entries(pristine), tar_entries(after)
    changes = Changes()

    def carried(path: str) -> bool:
        if matches(path, protected):
            changes.dropped[path] = "protected"
            return False
        if outputs is not None and not matches(path, outputs):
            changes.dropped[path] = "not an output"
            return False
        return True

    for path, (kind, content) in now.items():
        if before.get(path) == (kind, content):
            continue
        if kind == "link":
            changes.dropped[path] = "a symbolic link"
            if path in before and carried(path):
                changes.deleted.append(path)  # what was there is gone: a link is not a file
        elif carried(path):
            changes.written[path] = content
    for path in before:
        if path not in now and carried(path):
            changes.deleted.append(path)
    return changes


class Grader:
    """Grades runs of one producer (see the module docstring)."""

    def __init__(self, cfg: GraderConfig) -> None:
        self.cfg = cfg
        self.scoring = None if cfg.scoring in ("fraction", "all") else load_python_object(
            cfg.scoring, f"agent.grader.scoring {cfg.scoring!r}", kind="function")
        self.counts = {"graded": 0, "errors": 0, "regraded": 0}

    def hidden(self) -> tuple[str, ...]:
        """The row fields the agent must not see."""
        return (self.cfg.tests_field, self.cfg.setup_field)

    def changes(self, row: dict, pristine: bytes, after: bytes) -> Changes:
        own = row.get(self.cfg.protected_field) or []
        return workspace_changes(pristine, after, [*self.cfg.protected, *own], self.cfg.outputs)

    async def grade(self, group: TaskGroup, row: dict, changes: Changes) -> dict[str, Any]:
        """The report of the hidden tests on the task's start plus `changes`, in a fresh sandbox."""
        tests = row.get(self.cfg.tests_field)
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise ValueError(f"task field {self.cfg.tests_field!r} must be a non-empty list of test snippets "
                             "(agent.grader.tests_field)")
        report: dict[str, Any] = {"passed": 0, "total": len(tests), "error": None}
        self.counts["graded"] += 1
        if changes.size > self.cfg.max_changes_mb * (1 << 20):
            report["error"] = f"changes of {changes.size >> 20} MiB, over agent.grader.max_changes_mb"
            return report
        for tries in range(1, GRADE_TRIES + 1):
            sandbox_id = await group.fork()
            generation = group.pool.get(sandbox_id).generation
            try:
                report["passed"] = await asyncio.to_thread(self._judge, group.pool, sandbox_id, row, tests, changes)
                return report
            except Exception as exc:
                if not _died(group.pool, sandbox_id, generation):  # a limit, changes that do not apply: 0.0
                    self.counts["errors"] += 1
                    report["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    return report
                if tries == GRADE_TRIES:  # no verdict: the run is lost (and replayed), not scored 0
                    raise SandboxDied(f"the grading sandbox died under the judge {tries} times: {exc}") from exc
                self.counts["regraded"] += 1
            finally:
                await group.sandboxes.release(sandbox_id)
        raise AssertionError("unreachable")

    def _judge(self, pool: Pool, sandbox_id: str, row: dict, tests: list[str], changes: Changes) -> int:
        if changes.deleted:
            r = pool.exec(sandbox_id, ExecRequest(cmd=["rm", "-rf", "--", *changes.deleted]))
            if not r.ok:
                raise RuntimeError(f"could not delete {changes.deleted[:3]}: {r.stderr[-200:]}")
        workspace.seed(pool.box(sandbox_id), files=changes.written)
        solution = WORKER_PATH + (row.get(self.cfg.setup_field) or "")
        wall = self.cfg.test_timeout_s * len(tests) + 10.0
        return passed_tests(_Judged(pool, sandbox_id), solution, tests, self.cfg.test_timeout_s, wall)

    def score(self, report: dict[str, Any]) -> float:
        if report["error"] is not None and self.scoring is None:
            return 0.0
        if self.scoring is not None:
            return float(self.scoring(report))
        if self.cfg.scoring == "all":
            return float(report["passed"] == report["total"])
        return report["passed"] / report["total"]


def _died(pool: Pool, sandbox_id: str, generation: int) -> bool:
    """Whether the sandbox is gone or replaced since `generation` (what it held is lost)."""
    try:
        return pool.get(sandbox_id).generation != generation or not pool.box(sandbox_id).alive
    except SandboxError:  # reaped meanwhile
        return True


class _Judged:
    """What passed_tests calls `exec` on: the grading sandbox, the judge kept off the workspace's imports."""

    def __init__(self, pool: Pool, sandbox_id: str) -> None:
        self.pool, self.id = pool, sandbox_id

    def exec(self, *, code: str, timeout_s: float, judge: bool) -> ExecResult:
        return self.pool.exec(self.id, ExecRequest(code=JUDGE_PATH + code, timeout_s=timeout_s, judge=judge))
