"""Agent runs while their task sandboxes fail: every run trained or replayed, every sandbox released.

    python benchmarks/task_sandbox_faults.py              # 200 runs -> docs/results/task_sandbox_faults.json
    python benchmarks/task_sandbox_faults.py --runs 40 --out /tmp/faults.json

Groups of the real `AgentProducer` with `agent.sandbox` and `agent.grader` play a small repository
task (`add` subtracts; hidden tests by the judge) through the real endpoint and the embedded engine
on the built-in calculator model (`builtin:calc`, 280k parameters: generation is a few ms a turn,
the sandboxes are the cost). Each run's agent asks the model, reads `calc.py` in its sandbox, fixes
the bug with a shell command, asks again and returns: an honest fix, so every run that trains must
score 1.0. Meanwhile faults are injected (`--period-s` apart, kinds in turn):

    run killed               SIGKILL to every process of a run's sandbox (its process group)
    run stopped              a run's sandbox stopped under it (LocalSandbox.stop, as a reaper would)
    exec hung                SIGSTOP to a run's sandbox agent: its next call runs past its deadline
    grader fork killed       SIGKILL to the sandbox a run is being graded in
    base killed              SIGKILL to a group's prepared sandbox while it is held
    copy killed              SIGKILL to a sandbox taking (or holding) a copy of the workspace, before its run
    spare dies before copy   every k-th spare taken for a copy killed before the copy (`--spare-every`)
    base dies while prepared every k-th group's first sandbox killed before its preparation (`--base-every`)

At the end it counts what became of every run the producer started (trained, lost and replayed,
lost with no retry left, cancelled; `unaccounted` must be 0), the trained runs that scored other
than 1.0 (a fault that corrupted a score: goal 0), the dropped groups (played again by the driver
under a new key, as the trainer's worker does), and what is left: sandboxes still leased, pool
leases, bwrap processes of this process, sandbox cgroups and temp folders of our sandbox ids (all
goal 0). Needs root and bubblewrap.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextvars
import glob
import json
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cadence.agents.config import GraderConfig, TaskSandboxConfig  # noqa: E402
from cadence.agents.grader import Grader  # noqa: E402
from cadence.agents.task_sandbox import TaskSandboxes  # noqa: E402
from cadence.sandbox import cgroup  # noqa: E402
from cadence.sandbox.models import SandboxError  # noqa: E402

BUGGY, FIXED = "def add(a, b):\n    return a - b\n", "def add(a, b):\n    return a + b\n"
HIDDEN = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"]
FIX = "sed -i 's/a - b/a + b/' calc.py"
INJECTED = ("run killed", "run stopped", "exec hung", "grader fork killed", "base killed", "copy killed")
SPARE, BASE_AT_START = "spare dies before copy", "base dies while prepared"
EXEC_TIMEOUT_S = 2.0  # an agent's command; a hung sandbox answers nothing for this plus the pool's grace

# Set while a group opens: its first acquire is the group's prepared sandbox (`base`); any other
# acquire is for a copy of the workspace (a run's or a grading's). A list, so that tasks started
# inside open_group (copies filled ahead) see it emptied by that first acquire.
OPENING: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("opening", default=None)


class Faults:
    """The faults injected, by kind, and the sandboxes each role holds now (targets)."""

    def __init__(self, seed: int, spare_every: int, base_every: int, kinds: tuple[str, ...] = INJECTED) -> None:
        self.rng, self.kinds = random.Random(seed), kinds
        self.every = {"copy": spare_every, "base": base_every}
        self.injected: collections.Counter[str] = collections.Counter()
        self.acquired: collections.Counter[str] = collections.Counter()
        self.roles: dict[str, str] = {}  # leased sandbox id -> base, copy or grader
        self.playing: set[str] = set()  # run sandboxes whose agent is playing
        self.open_failed = 0  # groups whose prepared state could not be made
        self.ids: set[str] = set()  # every sandbox id this benchmark leased

    def on_acquire(self, sandboxes: TaskSandboxes, sandbox_id: str, role: str) -> None:
        """Kills every k-th copy's spare before the copy, and every k-th base before its preparation."""
        self.roles[sandbox_id] = role
        self.ids.add(sandbox_id)
        self.acquired[role] += 1
        every = self.every[role]
        if every and self.acquired[role] % every == 0 and _kill(sandboxes, sandbox_id):
            self.injected[SPARE if role == "copy" else BASE_AT_START] += 1

    def targets(self, kind: str) -> list[str]:
        if kind == "base killed":
            return sorted(i for i, r in self.roles.items() if r == "base")
        if kind == "grader fork killed":
            return sorted(i for i, r in self.roles.items() if r == "grader")
        if kind == "copy killed":  # holding (or receiving) a copy that no run plays yet
            return sorted(i for i, r in self.roles.items() if r == "copy" and i not in self.playing)
        return sorted(self.playing)

    async def inject(self, sandboxes: TaskSandboxes, kind: str) -> bool:
        """One fault of `kind` on a sandbox that holds that role now; False when none does."""
        targets = self.targets(kind)
        if not targets:
            return False
        target = self.rng.choice(targets)
        if kind == "run stopped":
            box = _box(sandboxes, target)
            if box is None or not box.alive:
                return False
            await asyncio.to_thread(box.stop)
        elif kind == "exec hung":
            box = _box(sandboxes, target)
            if box is None or box.agent_pid is None or not _signal(box.agent_pid, signal.SIGSTOP):
                return False
        elif not _kill(sandboxes, target):
            return False
        self.injected[kind] += 1
        return True

    async def drive(self, sandboxes: TaskSandboxes, period_s: float, most: int | None) -> None:
        """Every `period_s`, the next kind in turn that has a target now."""
        turn = 0
        while most is None or sum(self.injected.values()) < most:
            await asyncio.sleep(period_s)
            for step in range(len(self.kinds)):
                kind = self.kinds[(turn + step) % len(self.kinds)]
                if sandboxes.pool is not None and await self.inject(sandboxes, kind):
                    turn += step + 1
                    break


class WatchedSandboxes(TaskSandboxes):
    """TaskSandboxes that tell `faults` what each leased sandbox is for."""

    def __init__(self, cfg: TaskSandboxConfig, faults: Faults) -> None:
        super().__init__(cfg)
        self.faults = faults

    async def acquire(self, template: str | None, owner: str | None = None) -> str:
        sandbox_id = await super().acquire(template, owner)
        opening = OPENING.get()
        self.faults.on_acquire(self, sandbox_id, opening.pop() if opening else "copy")
        return sandbox_id

    async def release(self, sandbox_id: str) -> None:
        self.faults.roles.pop(sandbox_id, None)
        await super().release(sandbox_id)

    async def open_group(self, row: dict, *args: Any, **kw: Any):
        token = OPENING.set(["base"])
        try:
            return await super().open_group(row, *args, **kw)
        except SandboxError:  # the producer drops the group and counts one lost run
            self.faults.open_failed += 1
            raise
        finally:
            OPENING.reset(token)


class GradingGroup:
    """A task group as the grader sees it: the sandboxes it forks are marked as gradings'."""

    def __init__(self, group: Any, faults: Faults) -> None:
        self.group, self.faults = group, faults

    async def fork(self, *args: Any, **kw: Any) -> str:
        sandbox_id = await self.group.fork(*args, **kw)
        self.faults.roles[sandbox_id] = "grader"
        return sandbox_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self.group, name)


class WatchedGrader(Grader):
    def __init__(self, cfg: GraderConfig, faults: Faults) -> None:
        super().__init__(cfg)
        self.faults = faults

    async def grade(self, group, row: dict, changes) -> dict[str, Any]:
        return await super().grade(GradingGroup(group, self.faults), row, changes)


def _box(sandboxes: TaskSandboxes, sandbox_id: str):
    try:
        return sandboxes.pool.box(sandbox_id) if sandboxes.pool is not None else None
    except SandboxError:
        return None


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def _kill(sandboxes: TaskSandboxes, sandbox_id: str) -> bool:
    """SIGKILL to every process of the sandbox (bwrap's process group)."""
    box = _box(sandboxes, sandbox_id)
    proc = box.proc if box is not None else None
    if proc is None or proc.poll() is not None:
        return False
    try:
        os.killpg(proc.pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


def make_agent(faults: Faults, wrong_start: list[str], think_s: float):
    """The agent: two model turns around a look at calc.py and the fix, in its own sandbox."""

    async def agent(client, task) -> float:
        sandbox = task["sandbox"]
        faults.playing.add(sandbox.id)
        try:
            messages = [{"role": "user", "content": "fix add"}]
            reply = await client.chat.completions.create(model="cadence", messages=messages, max_tokens=6)
            messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
            start = await sandbox.aexec("cat calc.py", timeout_s=EXEC_TIMEOUT_S)
            if start.stdout != BUGGY:  # the run did not start from the task's workspace
                wrong_start.append(sandbox.id)
            fixed = await sandbox.aexec(f"sleep {think_s}; {FIX}", timeout_s=EXEC_TIMEOUT_S + think_s)
            messages.append({"role": "user", "content": f"exit {fixed.exit_code}"})
            await client.chat.completions.create(model="cadence", messages=messages, max_tokens=6)
            return 0.0  # the agent's own number: the grader's counts
        finally:
            faults.playing.discard(sandbox.id)

    return agent


def make_repo(folder: Path) -> Path:
    (folder / "tests").mkdir(parents=True)
    (folder / "calc.py").write_text(BUGGY)
    (folder / "tests" / "test_calc.py").write_text("from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    (folder / "README.md").write_text("calc: add two numbers\n")
    return folder


def bwrap_children() -> set[int]:
    """The bwrap processes whose parent is this process."""
    me = str(os.getpid())
    bwrap = set()
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(stat[:-4] + "cmdline", "rb") as f:
                argv0 = f.read().split(b"\0")[0]
        except OSError:
            continue
        if fields[1] == me and argv0.endswith(b"bwrap"):
            bwrap.add(int(stat.split("/")[2]))
    return bwrap


def left_behind(ids: set[str], before: set[int] = frozenset()) -> dict[str, list]:
    """What our sandboxes left: bwrap children of this process not in `before` (those that ran before the
    benchmark started, e.g. an earlier test's in the same process), cgroups and temp folders named by our ids."""
    bwrap = sorted(bwrap_children() - before)
    parents = set(cgroup._layout()[1].values())
    cgroups = [d for p in parents for d in glob.glob(os.path.join(p, cgroup.PREFIX + "*"))
               if os.path.basename(d)[len(cgroup.PREFIX):].split("-")[0] in ids]
    temp = [p for p in glob.glob(os.path.join(tempfile.gettempdir(), "*")) if any(i in os.path.basename(p) for i in ids)]
    return {"bwrap_processes": bwrap, "cgroups": cgroups, "temp_folders": temp}


@dataclass
class Plan:
    runs: int = 200  # runs to train (whole groups)
    group_size: int = 4
    groups_at_once: int = 4
    period_s: float = 1.0  # between faults injected by the driver
    kinds: tuple[str, ...] = INJECTED  # what the driver injects, in turn
    most_faults: int | None = None  # the driver stops after this many faults in all
    spare_every: int = 10  # every k-th spare taken for a copy killed before the copy (0: never)
    base_every: int = 6  # every k-th group's sandbox killed before its preparation (0: never)
    think_s: float = 0.5  # each run's command sleeps this long
    tasks: int = 4
    seed: int = 0


async def play_all(plan: Plan, folder: Path) -> dict:
    """`plan.runs` trained runs (whole groups) with faults injected; the counts (module docstring)."""
    import torch

    from cadence.agents import AgentEndpoint
    from cadence.agents.producer import AgentProducer
    from cadence.inference.embedded import EmbeddedEngine
    from cadence.inference.hub import InferenceHub
    from cadence.models.loading import load_policy, load_tokenizer

    torch.set_num_threads(1)
    before = bwrap_children()
    tok = load_tokenizer("builtin:calc")
    hub = InferenceHub([EmbeddedEngine(load_policy("builtin:calc").eval(), tok, max_batch_size=32, seed=plan.seed)])
    rows = [{"prompt": "add(a, b) should return the sum; fix calc.py", "instance_id": f"calc-{i}",
             "repo": str(make_repo(folder / f"repo{i}")), "tests": HIDDEN, "test_setup": "from calc import add"}
            for i in range(plan.tasks)]
    faults, wrong_start = Faults(plan.seed, plan.spare_every, plan.base_every, plan.kinds), []
    group_size = plan.group_size
    sandboxes = WatchedSandboxes(TaskSandboxConfig(warm=group_size * plan.groups_at_once, http=False), faults)
    producer = AgentProducer(AgentEndpoint(hub, tok), make_agent(faults, wrong_start, plan.think_s), rows, group_size,
                             sandboxes=sandboxes, grader=WatchedGrader(GraderConfig(), faults), timeout_s=120.0)
    groups_wanted = -(-plan.runs // group_size)
    trained: list = []
    played = dropped = 0

    async def drive() -> dict:
        nonlocal played, dropped
        injector = asyncio.ensure_future(faults.drive(sandboxes, plan.period_s, plan.most_faults))
        running: set[asyncio.Future] = set()
        try:
            while len(trained) < groups_wanted:
                while len(running) < plan.groups_at_once and len(trained) + len(running) < groups_wanted:
                    running.add(asyncio.ensure_future(producer.play(played, played)))  # key: a task's index
                    played += 1
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for group in done:
                    if group.result() is None:
                        dropped += 1  # its task is owed: the driver plays another group for it
                    else:
                        trained.append(group.result())
        finally:
            injector.cancel()
        await asyncio.sleep(0)
        leases = {"leased_by_producer": len(sandboxes.leased), "pool_leases": sandboxes.pool.counts()["busy"],
                  "acquired": sandboxes.counts["acquired"], "released": sandboxes.counts["released"]}
        history = [e.model_dump() for e in sandboxes.pool.events.query(limit=10**6)]
        return {"leases": leases, "metrics": producer.metrics(), "history": history}

    try:
        end = await hub.serving(drive())
    finally:
        await producer.endpoint.stop()
        await sandboxes.close()
    leftover = left_behind(faults.ids, before)
    for _ in range(300):  # a stop still reaping its processes: seconds on a loaded machine
        if not any(leftover.values()):
            break
        await asyncio.sleep(0.1)
        leftover = left_behind(faults.ids, before)
    leaked_ids = {os.path.basename(c)[len(cgroup.PREFIX):].split("-")[0] for c in leftover["cgroups"]}
    leftover["events_of_leaked"] = [[e["sandbox_id"], e["generation"], e["state"], e["reason"][:120]]
                                    for e in end["history"] if e["sandbox_id"] in leaked_ids]
    m = {k.removeprefix("agent/").removesuffix("_total"): int(v) for k, v in end["metrics"].items()
         if k.startswith("agent/runs") or k.startswith("agent/groups")}
    samples = [s for g in trained for s in g.samples]
    attempts = group_size * (played - faults.open_failed) + m["runs_retried"]
    accounted = len(samples) + m["runs_lost"] - faults.open_failed + m["runs_cancelled"]
    return {
        "faults_injected": dict(faults.injected), "faults_total": sum(faults.injected.values()),
        "groups_played": played, "groups_trained": len(trained), "groups_dropped": dropped,
        "runs_trained": len(samples), "runs_lost": m["runs_lost"], "runs_replayed": m["runs_retried"],
        "runs_lost_not_replayed": m["runs_lost"] - m["runs_retried"] - faults.open_failed,
        "groups_not_opened": faults.open_failed, "runs_cancelled": m["runs_cancelled"],
        "run_attempts": attempts, "runs_unaccounted": attempts - accounted,
        "trained_runs_not_scored_1": sum(s.reward != 1.0 for s in samples),
        "grading_errors": int(end["metrics"].get("agent/grader_errors_total", 0)),
        "gradings_run_again": int(end["metrics"].get("agent/grader_regraded_total", 0)),
        "runs_started_from_a_wrong_workspace": len(wrong_start),
        # A sandbox left running has a bwrap process and cgroups named by its id: counted once.
        "sandboxes_leaked": end["leases"]["leased_by_producer"] + end["leases"]["pool_leases"]
        + max(len(leftover["bwrap_processes"]), len(leaked_ids)) + len(leftover["temp_folders"]),
        **end["leases"], "left_behind": leftover, "engine": "embedded (builtin:calc)",
    }


def table(result: dict) -> str:
    rows = ["| fault | injected |", "|---|---|"]
    rows += [f"| {k} | {result['faults_injected'].get(k, 0)} |" for k in (*INJECTED, SPARE, BASE_AT_START)]
    rows += ["", "| runs trained | replayed | lost, not replayed | unaccounted | trained, not scored 1.0 "
             "| gradings run again | groups dropped (played again) | sandboxes leaked |", "|---|---|---|---|---|---|---|---|",
             f"| {result['runs_trained']} | {result['runs_replayed']} | {result['runs_lost_not_replayed']} "
             f"| {result['runs_unaccounted']} | {result['trained_runs_not_scored_1']} | {result['gradings_run_again']} "
             f"| {result['groups_dropped']} | {result['sandboxes_leaked']} |"]
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    plan = Plan()
    for name, value in vars(plan).items():
        if isinstance(value, (int, float)) and name != "most_faults":
            p.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    p.add_argument("--out", default="docs/results/task_sandbox_faults.json")
    args = p.parse_args()
    plan = Plan(**{k: v for k, v in vars(args).items() if k != "out"})
    load_before = os.getloadavg()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(play_all(plan, Path(tmp)))
    result.update({"wall_s": round(time.monotonic() - t0, 1), "load_before": [round(x, 1) for x in load_before],
                   "load_after": [round(x, 1) for x in os.getloadavg()], "cpus": os.cpu_count(),
                   "command": "python benchmarks/task_sandbox_faults.py " + " ".join(sys.argv[1:])})
    print(json.dumps(result, indent=1))
    print(table(result))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    sys.exit(0 if lost_nothing(result) else 1)


def lost_nothing(result: dict) -> bool:
    """Every run accounted for and scored right, nothing left behind."""
    return (result["runs_unaccounted"] == 0 and result["trained_runs_not_scored_1"] == 0
            and result["sandboxes_leaked"] == 0)


if __name__ == "__main__":
    main()
