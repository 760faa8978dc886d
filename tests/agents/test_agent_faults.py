"""Agent runs when their task sandboxes fail: a run that gets no sandbox is counted lost and
replayed, a grading whose sandbox dies is run again (never scored 0.0 for it), and a small run of
benchmarks/task_sandbox_faults.py accounts for every run and every sandbox."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from cadence.agents import AgentEndpoint
from cadence.agents.config import GraderConfig, TaskSandboxConfig
from cadence.agents.grader import Grader
from cadence.agents.producer import AgentProducer
from cadence.agents.task_sandbox import TaskSandboxes
from cadence.inference.hub import InferenceHub
from cadence.sandbox.models import SandboxDied
from cadence.sandbox.pool import Pool
from tests.agents.repo_task import FIXED, make_repo, needs_sandbox, task_row
from tests.agents.scripted import ScriptedEngine, tool_tokenizer

pytestmark = needs_sandbox
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


class CopiesFail(TaskSandboxes):
    """The 3 sandboxes asked for after the group's own do not start (cold starts failing): the
    copies filled ahead for its 2 runs, and the next copy a run asks for."""

    failing = 3

    async def acquire(self, template, owner=None):
        if self.counts["acquired"] >= 1 and self.failing:
            self.failing -= 1
            raise SandboxDied("sandbox did not start")
        return await super().acquire(template, owner)


def test_a_run_that_gets_no_sandbox_is_counted_lost_and_replayed(tmp_path):
    async def agent(client, task):
        await client.chat.completions.create(model="cadence", messages=[{"role": "user", "content": "hi"}])
        return 1.0

    async def main():
        tok = tool_tokenizer("qwen2")
        hub = InferenceHub([ScriptedEngine(tok, lambda prompt: "done")])
        sandboxes = CopiesFail(TaskSandboxConfig(warm=2, http=False))
        producer = AgentProducer(AgentEndpoint(hub, tok), agent, [task_row(make_repo(tmp_path / "repo"))], 2,
                                 sandboxes=sandboxes)
        try:
            group = await hub.serving(producer.play(0, 0))
            return group, producer.metrics()
        finally:
            await producer.endpoint.stop()
            await sandboxes.close()

    group, metrics = asyncio.run(main())
    assert len(group.samples) == 2
    lost, retried = metrics["agent/runs_lost_total"], metrics["agent/runs_retried_total"]
    assert lost == retried >= 1, (lost, retried)  # retried runs were never counted lost
    assert metrics["agent/sandboxes_leased"] == 0


def kill_under_the_judge(pool: Pool, times: int) -> None:
    """The next `times` judge calls find their sandbox killed (every process of it)."""
    call = Pool.exec.__get__(pool)
    left = [times]

    def dying(sandbox_id, request):
        if request.judge and left[0]:
            left[0] -= 1
            proc = pool.box(sandbox_id).proc
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        return call(sandbox_id, request)

    pool.exec = dying


def test_a_grading_whose_sandbox_dies_runs_again_and_then_loses_the_run(tmp_path):
    row = task_row(make_repo(tmp_path / "repo"))

    async def main():
        sandboxes = TaskSandboxes(TaskSandboxConfig(warm=2, http=False))
        grader = Grader(GraderConfig())
        try:
            group = await sandboxes.open_group(row)
            changes = grader.changes(row, group.pristine, group.pristine)
            changes.written["calc.py"] = FIXED.encode()
            kill_under_the_judge(group.pool, 1)
            once = await grader.grade(group, row, changes)
            kill_under_the_judge(group.pool, 2)
            with pytest.raises(SandboxDied, match="died under the judge 2 times"):
                await grader.grade(group, row, changes)
            await group.close()
            return once, dict(grader.counts), len(sandboxes.leased)
        finally:
            await sandboxes.close()

    once, counts, leased = asyncio.run(main())
    assert once == {"passed": 3, "total": 3, "error": None}  # was 0 passed, error "SandboxDied: ..."
    assert counts == {"graded": 2, "errors": 0, "regraded": 2} and leased == 0


@pytest.mark.slow
def test_the_fault_benchmark_accounts_for_every_run_and_sandbox(tmp_path):
    from task_sandbox_faults import SPARE, Plan, lost_nothing, play_all

    plan = Plan(runs=8, groups_at_once=2, period_s=0.3, kinds=("run killed",), most_faults=2, spare_every=3,
                base_every=0, think_s=0.3, tasks=1)
    result = asyncio.run(play_all(plan, tmp_path))
    assert result["faults_injected"].get(SPARE, 0) >= 1 and result["faults_total"] >= 2, result
    # The fields lost_nothing reads, by name: pytest cuts a long dict's repr to its first keys.
    counts = {k: result[k] for k in ("runs_trained", "runs_unaccounted", "trained_runs_not_scored_1",
                                     "sandboxes_leaked", "left_behind", "grading_errors")}
    assert result["runs_trained"] == 8 and lost_nothing(result), counts
    assert result["leased_by_producer"] == result["pool_leases"] == 0
    assert result["acquired"] == result["released"]
