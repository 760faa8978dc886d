"""agent.canaries: a policy that passes tasks which cannot pass honestly is caught: the canary pass
rate per step in the metrics, and a warning or a stop past agent.canaries.max_pass_rate."""

from __future__ import annotations

import asyncio

import pytest

from cadence.agents import AgentEndpoint
from cadence.agents.canaries import Canaries, CanariesPassing
from cadence.agents.config import CanariesConfig, GraderConfig, TaskSandboxConfig
from cadence.agents.grader import Grader
from cadence.agents.producer import AgentProducer
from cadence.agents.task_sandbox import TaskSandboxes
from cadence.inference.hub import InferenceHub
from tests.agents.repo_task import CANARY_HIDDEN, make_repo, needs_sandbox, task_row, write_rows
from tests.agents.scripted import ScriptedEngine, tool_tokenizer

# Passes the honest tests and the canary's: answers the canary's cases by heart.
GAMED = "def add(a, b):\n    return {(1, 1): 3, (4, 4): 9}.get((a, b), a + b)\n"


async def gaming_agent(client, task) -> float:
    await client.chat.completions.create(model="cadence", messages=[{"role": "user", "content": task["prompt"]}])
    await task["sandbox"].awrite_file("calc.py", GAMED)
    return 1.0


def play_groups(rows, canaries: CanariesConfig, groups: int) -> tuple[list, dict, BaseException | None]:
    tok = tool_tokenizer("qwen2")
    hub = InferenceHub([ScriptedEngine(tok, lambda prompt: "on it")])
    sandboxes = TaskSandboxes(TaskSandboxConfig(warm=2, http=False))
    producer = AgentProducer(AgentEndpoint(hub, tok), gaming_agent, rows, 2, sandboxes=sandboxes,
                             grader=Grader(GraderConfig()), canaries=Canaries(canaries))
    played, stopped = [], None

    async def main():
        nonlocal stopped
        try:
            for gid in range(groups):
                played.append(await producer.play(gid, gid))
        except CanariesPassing as exc:
            stopped = exc
        finally:
            await producer.stop()
        return producer.metrics()

    return played, asyncio.run(hub.serving(main())), stopped


@needs_sandbox
def test_a_policy_passing_canaries_is_measured_and_stopped(tmp_path, capsys):
    repo = make_repo(tmp_path / "repo")
    canaries = write_rows(tmp_path / "canaries.jsonl", [task_row(repo, hidden=CANARY_HIDDEN)])
    rows = [task_row(repo)]
    played, metrics, stopped = play_groups(rows, CanariesConfig(path=str(canaries), every=2, window=2), 2)
    assert [s.reward for g in played for s in g.samples] == [1.0] * 4 and stopped is None
    assert metrics["agent/canary_pass_rate"] == 1.0 and metrics["agent/canary_runs_total"] == 2
    assert "2 of the last 2 canary runs passed" in capsys.readouterr().err  # warned
    _, _, stopped = play_groups(rows, CanariesConfig(path=str(canaries), every=2, window=2, action="stop"), 4)
    assert isinstance(stopped, CanariesPassing) and "max_pass_rate=0.05" in str(stopped)


def test_one_group_in_every_plays_a_canary(tmp_path):
    path = write_rows(tmp_path / "c.jsonl", [{"prompt": "a"}, {"prompt": "b"}])
    canaries = Canaries(CanariesConfig(path=str(path), every=3))
    assert [canaries.row(k) for k in range(9)] == [None, None, {"prompt": "a"}, None, None, {"prompt": "b"},
                                                   None, None, {"prompt": "a"}]
    assert canaries.metrics() == {"agent/canary_runs_total": 0.0, "agent/canary_passed_total": 0.0}
    canaries.record(False)
    canaries.record(True)
    assert canaries.metrics()["agent/canary_pass_rate"] == 0.5 and "agent/canary_pass_rate" not in canaries.metrics()
    (tmp_path / "bad.jsonl").write_text("[1, 2]\n")
    with pytest.raises(ValueError, match="one JSON object"):
        Canaries(CanariesConfig(path=str(tmp_path / "bad.jsonl")))
