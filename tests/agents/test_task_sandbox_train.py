"""`cadence train` with agent.sandbox and agent.grader: 2 steps in which some agents' bash tool runs
in their task sandbox through the handle and the others reach theirs only over HTTP, from another
process (one train covers both: a train is most of the test's time); the reward is the grader's,
canaries are counted."""

from __future__ import annotations

import pytest

from cadence.config import load_config
from cadence.observe.metrics import read_jsonl
from cadence.recipes.train_rlvr import train
from tests.agents.repo_task import CANARY_HIDDEN, make_repo, needs_sandbox, task_row, write_rows
from tests.quick_run import QUICK_RUN

pytestmark = [needs_sandbox, pytest.mark.slow]

# The user's agents: no cadence import. The model's reply decides whether the bash tool runs the
# fix, so a group's runs differ; the agents' own return (0.0) is not the reward.
AGENTS = '''
import asyncio
import sys
from pathlib import Path

FIX = "sed -i 's/a - b/a + b/' calc.py"


def command_for(reply):
    return FIX if len(reply) % 2 == 0 else "ls"


async def run(client, task):
    reply = await client.completions.create(model="cadence", prompt=task["prompt"], max_tokens=4)
    done = await task["sandbox"].aexec(command_for(reply.choices[0].text))  # the bash tool
    assert done.exit_code == 0, done.stderr
    return 0.0


CURL = """
import json, sys, urllib.request
url, token, command = sys.argv[1:]
body = json.dumps({"cmd": command}).encode()
request = urllib.request.Request(url + "/exec", body, {"Authorization": "Bearer " + token,
                                                       "Content-Type": "application/json"})
print(json.load(urllib.request.urlopen(request))["exit_code"])
"""


async def run_over_http(client, task):
    reply = await client.completions.create(model="cadence", prompt=task["prompt"], max_tokens=4)
    tool = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CURL, task["sandbox_url"], task["sandbox_token"], command_for(reply.choices[0].text),
        stdout=asyncio.subprocess.PIPE)
    out, _ = await tool.communicate()
    assert out.strip() == b"0", out
    return 0.0


async def run_either(client, task):
    """Even tasks through the handle, odd ones (and canaries) over HTTP; the way taken is logged."""
    over_http = not task["prompt"].startswith("task ") or int(task["prompt"].split()[1].rstrip(":")) % 2
    with open(Path(__file__).with_name("ways.log"), "a") as log:
        print("http" if over_http else "handle", file=log)
    return await (run_over_http if over_http else run)(client, task)
'''


def test_two_steps_with_agents_working_in_their_task_sandbox_by_handle_and_over_http(tmp_path):
    source = tmp_path / "outside" / "repo_agents.py"
    source.parent.mkdir()
    source.write_text(AGENTS)
    repo = make_repo(tmp_path / "repo")
    rows = write_rows(tmp_path / "rows.jsonl", [{**task_row(repo), "prompt": f"task {i}: fix add in calc.py"} for i in range(12)])
    canaries = write_rows(tmp_path / "canaries.jsonl", [task_row(repo, hidden=CANARY_HIDDEN)])
    run_dir = tmp_path / "run"
    cfg = load_config(None, [
        *QUICK_RUN, "rollout.prompts_per_step=2", "rollout.group_size=2", "trainer.micro_batch_size=4",
        f"agent.name=python:{source}:run_either", "task.name=jsonl", f"task.train_file={rows}", "task.answer_field=instance_id",
        "agent.sandbox.warm=2", "agent.sandbox.http=true", "agent.grader.scoring=fraction",
        f"agent.canaries.path={canaries}", "agent.canaries.every=2", "trainer.steps=2", f"logging.run_dir={run_dir}",
    ])
    train(cfg)
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    last = records[-1]
    assert last["agent/runs_lost_total"] == 0 and last["agent/grader_graded_total"] >= 8
    assert last["agent/returned_reward_mean"] == 0.0  # what the agents returned: logged, not trained
    assert 0.0 < max(r["reward/mean"] for r in records) <= 1.0  # the grader's: some runs fixed the bug
    assert last["agent/canary_runs_total"] >= 2 and last["agent/canary_passed_total"] == 0
    assert "agent/canary_pass_rate" in records[0] or "agent/canary_pass_rate" in last
    assert last["agent/sandboxes_acquired_total"] >= 3 * last["agent/grader_graded_total"] // 2
    assert set((source.parent / "ways.log").read_text().split()) == {"handle", "http"}

