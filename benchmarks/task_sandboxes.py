"""Task sandboxes for agent runs: how long a run waits for its sandbox (one holding a copy of the
group's prepared workspace) when 64 runs ask at once, and what grading a run costs (a fresh copy
of the task's start, the run's changes applied, the hidden tests by the judge).

    python benchmarks/task_sandboxes.py                  # -> docs/results/task_sandboxes.json
    python benchmarks/task_sandboxes.py --runs 64 --rounds 3 --gradings 20

Needs root and bubblewrap. The sandboxes run on a template (`--template`: by default a small one
built from a folder into a temporary store, on the host's system; `none`: the host's root). Each wait is timed from a run's ask (TaskGroup.fork, what group.run()
takes its sandbox with) to its sandbox holding the workspace. Rows:
- alone: `--runs` asks one at a time (each released before the next), the copy made on the ask;
- at once, copied on ask: rounds that each wait until `--runs` warm spares are ready, then
  `--runs` asks at once (asyncio.gather), each copy made on its ask;
- at once, warm: rounds that each fill `--runs` sandboxes with the workspace ahead
  (TaskGroup.prefill, what a group opened with `runs=` does) and wait until they and `--runs`
  spares are ready, then `--runs` asks at once.
Gradings run one after another, each of a run that fixed the bug (so the judge runs every test).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cadence.agents.config import GraderConfig, TaskSandboxConfig  # noqa: E402
from cadence.agents.grader import Grader  # noqa: E402
from cadence.agents.task_sandbox import TaskGroup, TaskSandboxes  # noqa: E402
from cadence.sandbox.models import ExecRequest  # noqa: E402
from cadence.sandbox.templates import TemplateStore  # noqa: E402

BUGGY, FIXED = "def add(a, b):\n    return a - b\n", "def add(a, b):\n    return a + b\n"
HIDDEN = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0", "assert add(10, 5) == 15", "assert add(0, 0) == 0"]


def make_repo(folder: Path, files: int) -> Path:
    """calc.py with the bug, its tests, and `files` modules of ~2 KB beside them (a small package)."""
    (folder / "tests").mkdir(parents=True)
    (folder / "calc.py").write_text(BUGGY)
    (folder / "tests" / "test_calc.py").write_text("from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    for i in range(files):
        (folder / f"module_{i}.py").write_text(f"VALUE_{i} = {i}\n" + "# padding\n" * 200)
    return folder


def build_template(folder: Path, name: str) -> None:
    """A template on the host's system with a file of its own, in a store under `folder` (for this run)."""
    (folder / "tpl" / "opt" / "task").mkdir(parents=True)
    (folder / "tpl" / "opt" / "task" / "README").write_text("the task image's own files\n")
    os.environ["CADENCE_TEMPLATE_DIR"] = str(folder / "store")
    TemplateStore().build_from_dir(name, str(folder / "tpl"))


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50_ms": round(1e3 * statistics.median(ordered), 1),
            "p90_ms": round(1e3 * ordered[math.ceil(0.9 * len(ordered)) - 1], 1),  # nearest rank
            "max_ms": round(1e3 * ordered[-1], 1), "n": len(ordered)}


async def wait_warm(sandboxes: TaskSandboxes, ready: int) -> None:
    while sandboxes.pool.counts()["ready"] < ready:
        await asyncio.sleep(0.05)


async def timed_fork(group: TaskGroup) -> tuple[float, str]:
    t0 = time.perf_counter()
    sandbox_id = await group.fork()
    return time.perf_counter() - t0, sandbox_id


async def asked_at_once(group: TaskGroup, runs: int) -> list[float]:
    """`runs` asks at once; each one's wait. Their sandboxes are released after."""
    forked = await asyncio.gather(*(timed_fork(group) for _ in range(runs)))
    await asyncio.gather(*(group.sandboxes.release(sandbox_id) for _, sandbox_id in forked))
    return [seconds for seconds, _ in forked]


async def measure(args: argparse.Namespace, repo: Path) -> dict:
    row = {"repo": str(repo), "tests": HIDDEN, "test_setup": "from calc import add"}
    template = None if args.template == "none" else args.template
    sandboxes = TaskSandboxes(TaskSandboxConfig(template=template, warm=args.runs, http=False,
                                                max_size=2 * args.runs + 8))
    grader = Grader(GraderConfig())
    alone: list[float] = []
    on_ask: list[float] = []
    warm: list[float] = []
    gradings: list[float] = []
    try:
        group = await sandboxes.open_group(row)
        if template is not None:  # the runs' sandboxes are on it
            sandbox_id = await group.fork()
            assert sandboxes.pool.exec(sandbox_id, ExecRequest(cmd="cat /opt/task/README")).ok
            await sandboxes.release(sandbox_id)
        await wait_warm(sandboxes, args.runs)
        for _ in range(args.runs):  # one at a time: what a run pays when nothing else asks
            seconds, sandbox_id = await timed_fork(group)
            alone.append(seconds)
            await sandboxes.release(sandbox_id)
        for _ in range(args.rounds):  # the two kinds of round side by side, under the same load
            await wait_warm(sandboxes, args.runs)
            on_ask += await asked_at_once(group, args.runs)
            group.prefill(args.runs)
            await asyncio.wait(list(group.copies))
            await wait_warm(sandboxes, args.runs)
            warm += await asked_at_once(group, args.runs)
        await wait_warm(sandboxes, min(args.runs, args.gradings + 1))
        changes = grader.changes(row, group.pristine, group.pristine)
        changes.written["calc.py"] = FIXED.encode()
        for _ in range(args.gradings):
            t0 = time.perf_counter()
            report = await grader.grade(group, row, changes)
            gradings.append(time.perf_counter() - t0)
            assert report == {"passed": len(HIDDEN), "total": len(HIDDEN), "error": None}, report
        await group.close()
    finally:
        await sandboxes.close()
    return {"acquire_with_workspace_alone": percentiles(alone),
            "acquire_with_workspace_at_once_copied_on_ask": percentiles(on_ask),
            "acquire_with_workspace_at_once_warm": percentiles(warm), "grading": percentiles(gradings)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=64, help="acquires at once (and warm spares)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--gradings", type=int, default=20)
    p.add_argument("--files", type=int, default=50, help="modules of ~2 KB in the task's repository")
    p.add_argument("--template", default="bench-task", help="a template in the store, 'bench-task' (built "
                   "here, in a temporary store) or 'none' (the host's root)")
    p.add_argument("--out", default="docs/results/task_sandboxes.json")
    args = p.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        if args.template == "bench-task":
            build_template(Path(tmp), args.template)
        result = asyncio.run(measure(args, make_repo(Path(tmp) / "repo", args.files)))
    result.update({"template": args.template, "runs_at_once": args.runs, "rounds": args.rounds, "repo_files": args.files + 2,
                   "load_before": [round(x, 1) for x in load_before],
                   "load_after": [round(x, 1) for x in os.getloadavg()], "cpus": os.cpu_count(),
                   "command": "python benchmarks/task_sandboxes.py " + " ".join(sys.argv[1:])})
    print(json.dumps(result, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
