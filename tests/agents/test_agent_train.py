"""`cadence train` on an agent written outside the package: it trains, composes with alpha, the
loss zoo and resume, and one that always fails stops the run loud (issue 29 items 3 and 5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cadence.assemble import agent_tasks
from cadence.config import load_config
from cadence.observe.metrics import read_jsonl
from cadence.recipes.train_rlvr import train
from tests.quick_run import QUICK_RUN

# The user's agent: the plain openai SDK, no cadence import. Its scaffold takes only a base_url
# and a model name, as SWE/terminal scaffolds do; `run` is the contract's adapter to it.
AGENT = '''
import json

import openai


async def solve(base_url, model, question):
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    try:
        reply = await client.completions.create(model=model, prompt=question, max_tokens=4, stop=["\\n"])
    finally:
        await client.close()
    return reply.choices[0].text


async def run(client, task, model, log):
    answer = await solve(str(client.base_url), model, task["prompt"])
    with open(log, "a") as f:
        f.write(json.dumps(task["prompt"]) + "\\n")
    return {"reward": float(answer.strip() == task["answer"]), "answer": answer}


def read_answer(text):
    raise ValueError(f"no number in {text!r}")


async def broken(client, task):
    reply = await client.completions.create(model="cadence", prompt=task["prompt"], max_tokens=4)
    return float(read_answer(reply.choices[0].text) == task["answer"])
'''


@pytest.fixture
def agent_file(tmp_path) -> Path:
    path = tmp_path / "outside" / "arith_agent.py"
    path.parent.mkdir()
    path.write_text(AGENT)
    return path


def overrides(agent_file: Path, run_dir: Path, *extra: str) -> list[str]:
    return [*QUICK_RUN, f"agent.name=python:{agent_file}:run", "agent.kwargs.model=cadence",
            f"agent.kwargs.log={run_dir.parent / 'tasks.log'}", "trainer.steps=2", f"logging.run_dir={run_dir}",
            *extra]


def cadence_train(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run([sys.executable, "-m", "cadence", "train", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def steps(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / "metrics.jsonl")


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["rollout.async_ratio=1", "algorithm.loss=cispo"]], ids=["sync", "alpha1-cispo"])
def test_an_agent_written_outside_the_package_trains_with_cadence_train(agent_file, tmp_path, extra):
    assert "import cadence" not in AGENT and "from cadence" not in AGENT
    run_dir = tmp_path / "run"
    done = cadence_train(overrides(agent_file, run_dir, *extra, "eval.after=true"), cwd=agent_file.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "held-out success after" in done.stdout  # an agent run is episodes: solved, not pass@1
    records = steps(run_dir)
    assert [r["step"] for r in records] == [1, 2]
    for record in records:  # 4 groups of 4 runs a step, each one request of the agent's own client
        assert record["agent/samples_total"] >= 16 * record["step"] and record["agent/runs_lost_total"] == 0
        assert 0.0 <= record["reward/mean"] <= 1.0 and record["train/response_tokens"] > 0
    assert len((tmp_path / "tasks.log").read_text().splitlines()) >= 32


@pytest.mark.slow
def test_a_resumed_agent_run_goes_on_with_the_next_tasks(agent_file, tmp_path):
    run_dir = tmp_path / "run"
    cfg = load_config(None, overrides(agent_file, run_dir, "checkpoint.every=1"))
    train(cfg)
    log = tmp_path / "tasks.log"
    log.unlink()
    longer = load_config(None, overrides(agent_file, run_dir, "checkpoint.every=1", "trainer.steps=3"))
    train(longer, resume=True, allow_change=["trainer.steps"])
    assert [r["step"] for r in steps(run_dir)] == [1, 2, 3]
    # Step 3 plays the tasks after the 8 trained in steps 1-2: tasks already started when the checkpoint
    # was written (the next step's, admitted as the weights went out) were never trained on, so are owed.
    tasks = agent_tasks(cfg)[0]
    assert sorted(json.loads(line) for line in log.read_text().splitlines()) == sorted(
        t["prompt"] for t in tasks[8:12] for _ in range(4))


@pytest.mark.slow
def test_an_agent_that_always_raises_stops_the_run_with_its_cause(agent_file, tmp_path):
    run_dir = tmp_path / "run"
    name = f"python:{agent_file}:broken"
    done = cadence_train([*QUICK_RUN, f"agent.name={name}", "trainer.steps=2", f"logging.run_dir={run_dir}"],
                         cwd=tmp_path)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"agent.name={name}: ") and "were lost and no group completed" in last
    assert "ValueError: no number in" in last and "env_errors.log" in last
    log = (run_dir / "env_errors.log").read_text()
    assert "arith_agent.py" in log and "in read_answer" in log and "cadence/agents" not in log
    assert log.count("Traceback") == 1  # the first failure of its kind, once
    assert not (run_dir / "metrics.jsonl").exists() or not (run_dir / "metrics.jsonl").read_text().strip()
