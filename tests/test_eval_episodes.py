"""`cadence eval` with env.* or agent.*: held-out success of episodes, as `cadence train` evaluates them."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from cadence.cli import app
from cadence.config import load_config
from cadence.recipes.evaluate import run_eval

ROOT = Path(__file__).resolve().parents[1]


def test_eval_of_an_environment_config_plays_held_out_episodes():
    done = CliRunner().invoke(app, ["eval", "builtin:frozenlake", "--config", str(ROOT / "examples" / "frozenlake.yaml"),
                                    "eval.episodes=4", "runtime.threads=1"])
    assert done.exit_code == 0, done.output
    assert "held-out success" in done.output and "(4 held-out episodes)" in done.output


AGENT = """
from pathlib import Path

async def run(client, task, log):
    with Path(log).open("a") as f:
        f.write("run\\n")
    reply = await client.chat.completions.create(model="cadence", max_tokens=4,
                                                 messages=[{"role": "user", "content": task["prompt"]}])
    return 1.0 if reply.choices[0].message is not None else 0.0
"""


def test_eval_of_an_agent_config_runs_the_agent_on_held_out_tasks(tmp_path):
    (tmp_path / "agent.py").write_text(AGENT)
    log = tmp_path / "runs.log"
    cfg = load_config(str(ROOT / "examples" / "agents" / "calculator.yaml"),
                      ["task.test_size=3", "eval.samples=1", "runtime.threads=1",
                       f"agent.name=python:{tmp_path / 'agent.py'}:run", f"agent.kwargs={{log: {log}}}"])
    result = run_eval(cfg)
    assert result.prompts == 3 and result.pass_at_1 == 1.0
    assert len(log.read_text().splitlines()) == 3  # the agent ran once per held-out task
