"""The agent section: bad names and values are one-line errors at load time; the tasks it draws."""

from __future__ import annotations

import pytest

from cadence.assemble import agent_tasks
from cadence.config import ConfigError, load_config
from cadence.rollout.episode_producer import HELD_OUT_SEED

AGENT = '''
import openai

async def run(client, task, model="cadence"):
    reply = await client.completions.create(model=model, prompt=task["prompt"], max_tokens=4)
    return float(reply.choices[0].text.strip() == task["answer"])

def not_async(client, task):
    return 0.0

async def too_few(client):
    return 0.0
'''


@pytest.fixture
def agent_file(tmp_path):
    path = tmp_path / "my_agent.py"
    path.write_text(AGENT)
    return path


def error(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as raised:
        load_config(None, overrides)
    return str(raised.value)


def test_an_agent_section_loads_and_names_its_tool_format(agent_file):
    cfg = load_config(None, [f"agent.name=python:{agent_file}:run", "agent.kwargs.model=m",
                             "agent.endpoint.tool_format=llama3"])
    assert cfg.agent.kwargs == {"model": "m"} and cfg.agent.tool_format == "llama3_json"
    assert load_config(None, [f"agent.name=python:{agent_file}:run"]).agent.tool_format == "auto"


@pytest.mark.parametrize("override, says", [
    ("agent.name=my_agent.run", "must be 'python:module:function' or 'python:/path/file.py:function'"),
    ("agent.name=python:{file}:rnu", "has no function 'rnu'. Did you mean: run?"),
    ("agent.name=python:{file}:not_async", "is not an async function: define it as `async def not_async(client, task)`"),
    ("agent.name=python:{file}:too_few", "takes ['client']: an agent is called as run(client, task, **agent.kwargs)"),
    ("agent.name=python:/no/such/agent.py:run", "file not found"),
    ("agent.kwargs.modle=x", "agent.kwargs.modle: unknown argument; did you mean 'model'?"),
    ("agent.endpoint.tool_format=qwen", "agent.endpoint.tool_format"),
    ("agent.tasks=rows", "agent.tasks"),
    ("env.name=frozenlake", "agent and env are both set"),
])
def test_bad_agent_settings_are_one_line_errors_naming_the_field(agent_file, override, says):
    name = [] if override.startswith("agent.name") else [f"agent.name=python:{agent_file}:run"]
    text = error([*name, override.format(file=agent_file)])
    assert says in text
    problem = text.removeprefix("invalid config:\n").strip()
    assert "\n" not in problem and problem.startswith(("agent", "config: agent and env"))


def test_tasks_are_dataset_rows_or_seeds_and_held_out_ones_are_never_trained(agent_file, tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(f'{{"question": "q{i}", "gold": "{i}", "level": {i % 3}}}\n' for i in range(20)))
    cfg = load_config(None, [f"agent.name=python:{agent_file}:run", "task.name=jsonl", f"task.train_file={data}",
                             "task.prompt_field=question", "task.answer_field=gold", "task.test_fraction=0.2"])
    train, held_out = agent_tasks(cfg)
    assert set(train[0]) == {"question", "gold", "level"} and train[0]["gold"] == train[0]["question"][1:]
    assert not {r["question"] for r in train} & {r["question"] for r in held_out} and len(held_out) == 4
    first, second = agent_tasks(cfg, 0, 2)[0], agent_tasks(cfg, 1, 2)[0]
    assert first[:2] == train[:4:2] and second[0] == train[1]  # worker i takes every other row
    seeds = load_config(None, [f"agent.name=python:{agent_file}:run", "agent.tasks=seeds", "eval.episodes=5"])
    train, held_out = agent_tasks(seeds)
    assert list(held_out) == list(range(HELD_OUT_SEED, HELD_OUT_SEED + 5)) and train[0] == 1000 and train[-1] < held_out[0]
