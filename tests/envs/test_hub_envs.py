"""Environment hubs (cadence.envs.hubs): a real environment of each hub's package through the
adapter, `cadence train` 2 steps on it, and one-line errors for bad names and missing packages.

Each hub's tests run where its package is installed (the test extra installs them)."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import sys
import threading
import time

import pytest
from typer.testing import CliRunner

from cadence.cli import app
from cadence.config import ConfigError, load_config
from cadence.envs import EnvConfig, EnvRunner
from cadence.envs.hubs import HUBS
from cadence.observe.metrics import read_jsonl
from cadence.recipes.train_rlvr import train
from tests.quick_run import QUICK_RUN


def train_two_steps(tmp_path, *env: str) -> list[dict]:
    """`cadence train` for 2 steps on the environment `env` names; the metrics of its steps."""
    cfg = load_config(None, [*QUICK_RUN, *env, "env.max_turns=2", "rollout.max_new_tokens=8",
                             "trainer.steps=2", f"logging.run_dir={tmp_path}/run"])
    summary = train(cfg)
    records = read_jsonl(summary.run_dir / "metrics.jsonl")
    steps = [r for r in records if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    assert steps[-1]["rollout/episodes_total"] >= 2 * 16 and steps[-1]["progress/samples_total"] == 32
    return steps


def config_error(*overrides: str) -> str:
    with pytest.raises(ConfigError) as failed:
        load_config(None, list(overrides))
    (line,) = [x for x in str(failed.value).splitlines() if "env" in x]  # one line says it
    return line


def play(cfg: EnvConfig, moves) -> list:
    """Reset on seed 3, then step with `moves(observation)` until the episode ends: the steps."""

    async def main():
        runner = EnvRunner.from_config(cfg)
        observation = (await runner.reset(3)).observation
        steps = []
        for _ in range(cfg.max_turns):
            step = await runner.step(moves(observation))
            steps.append(step)
            observation = step.observation
            if step.done:
                break
        await runner.close()
        return steps

    return asyncio.run(main())


# ------------------------------------------------------------------ names and listing (no hub needed)


def test_a_hub_whose_package_is_missing_names_the_extra_to_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gem" else real(name, *a))
    line = config_error("env.name=gem:game:GuessTheNumber-v0-easy")
    assert "needs gem-llm, not installed: pip install 'cadence[envs-gem]'" in line
    output = CliRunner().invoke(app, ["envs"]).output
    (listed,) = [x for x in output.splitlines() if x.startswith("  gem ")]
    assert "not installed: pip install 'cadence[envs-gem]'" in listed


def test_cadence_envs_lists_every_hub_with_its_state():
    output = CliRunner().invoke(app, ["envs"]).output
    for prefix, hub in HUBS.items():
        (listed,) = [x for x in output.splitlines() if x.startswith(f"  {prefix} ")]
        assert hub.example in listed and (hub.distribution in listed or hub.install in listed)


def test_a_hub_at_a_version_its_adapter_does_not_support_says_which_it_needs():
    from importlib.metadata import version

    from cadence.envs.hubs import Hub, install_state

    def hub(supported: str) -> Hub:  # pytest as a stand-in hub package: installed wherever this runs
        return Hub("cadence.envs.hubs.gem", "pytest", "pytest", "test", "env.name=x:y", "a hub", supported)

    assert install_state(hub("")) == install_state(hub(">=1")) == f"pytest {version('pytest')}"
    assert install_state(hub("<1")) == f"pytest {version('pytest')}, but this adapter needs pytest<1: " \
                                       "pip install 'cadence[test]'"


def test_an_unknown_hub_or_an_empty_id_is_one_line():
    assert "hubs: gem:ID, skyrl:ID, openenv:ID, verifiers:ID" in config_error("env.name=gemm:game:X")


# ------------------------------------------------------------------ GEM (gem-llm)


def test_gem_guess_the_number_through_the_adapter():
    pytest.importorskip("gem", reason="optional extra: pip install 'cadence[envs-gem]'")
    cfg = EnvConfig(name="gem:game:GuessTheNumber-v0-hard", max_turns=7)
    bounds = {}

    def bisect(observation: str) -> str:
        if not bounds:
            low, high = re.search(r"between (\d+) and (\d+)", observation).groups()
            bounds.update(low=int(low), high=int(high))
        elif "higher than" in observation:
            bounds["low"] = bounds["guess"] + 1
        else:
            bounds["high"] = bounds["guess"] - 1
        bounds["guess"] = (bounds["low"] + bounds["high"]) // 2
        return f"My guess is \\boxed{{{bounds['guess']}}}"  # GEM reads the whole response

    steps = play(cfg, bisect)
    assert steps[-1].terminated and steps[-1].reward == 1.0 and "Congratulations" in steps[-1].observation
    assert len(steps) > 1 and all(s.reward == 0.0 and "the target number is" in s.observation for s in steps[:-1])


def test_gem_same_seed_same_episode_and_a_bad_id_is_one_line():
    pytest.importorskip("gem", reason="optional extra: pip install 'cadence[envs-gem]'")
    from cadence.envs.registry import resolve_env_class

    cls = resolve_env_class("gem:rg:basic_arithmetic")
    assert cls().reset(5) == cls().reset(5) != cls().reset(6)
    played = cls(size=3)  # a reasoning-gym env draws from a new dataset every `size` resets
    for seed in (1, 2, 3, 4):
        played.reset(seed)
    assert played.reset(5) == cls(size=3).reset(5)  # the instance's history does not matter
    line = config_error("env.name=gem:game:GuessTheNumbr-v0-easy")
    assert "env.name 'gem:game:GuessTheNumbr-v0-easy': no environment" in line
    assert "did you mean 'game:GuessTheNumber-v0-easy'" in line


def test_gem_trains_two_steps(tmp_path):
    pytest.importorskip("gem", reason="optional extra: pip install 'cadence[envs-gem]'")
    train_two_steps(tmp_path, "env.name=gem:rg:basic_arithmetic")


# ------------------------------------------------------------------ skyrl-gym


def skyrl_rows(tmp_path) -> str:
    """A small dataset in SkyRL's row format (what SkyRL's gsm8k preprocessing writes)."""
    path = tmp_path / "sums.jsonl"
    rows = [
        {"prompt": [{"role": "user", "content": f"What is {a} + {b}? End with #### ANSWER."}],
         "env_class": "gsm8k_multi_turn", "reward_spec": {"method": "rule", "ground_truth": str(a + b)},
         "extra_info": {"max_turns": 3}}
        for a, b in [(2, 3), (4, 4), (10, 7)]
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_skyrl_gsm8k_multi_turn_through_the_adapter(tmp_path):
    pytest.importorskip("skyrl_gym", reason="optional extra: pip install 'cadence[envs-skyrl]'")
    cfg = EnvConfig(name="skyrl:gsm8k_multi_turn", kwargs={"data": skyrl_rows(tmp_path)}, max_turns=3)
    answers = iter(["I think it is 6 #### 6", "#### 5"])
    seen = []

    def moves(observation: str) -> str:
        seen.append(observation)
        return next(answers)

    wrong, right = play(cfg, moves)
    assert seen[0] == "What is 2 + 3? End with #### ANSWER."  # seed 3 plays row 3 % 3
    assert not wrong.done and 0 < wrong.reward < 1 and "#### ANSWER" in wrong.observation  # format credit
    assert right.terminated and right.reward == 1.0


def test_skyrl_names_and_data_are_checked_at_load(tmp_path):
    pytest.importorskip("skyrl_gym", reason="optional extra: pip install 'cadence[envs-skyrl]'")
    data = f"env.kwargs.data={skyrl_rows(tmp_path)}"
    assert "no environment 'gsm8'; did you mean 'gsm8k'" in config_error("env.name=skyrl:gsm8", data)
    assert "env.kwargs.data: a skyrl-gym environment plays rows" in config_error("env.name=skyrl:gsm8k")
    assert "env.kwargs.data: file not found" in config_error("env.name=skyrl:gsm8k", f"{data}.missing")


def test_skyrl_trains_two_steps(tmp_path):
    pytest.importorskip("skyrl_gym", reason="optional extra: pip install 'cadence[envs-skyrl]'")
    train_two_steps(tmp_path, "env.name=skyrl:gsm8k_multi_turn", f"env.kwargs.data={skyrl_rows(tmp_path)}")


# ------------------------------------------------------------------ OpenEnv (openenv-core)

ECHO = "openenv:echo_env.server.echo_env_environment:EchoEnvironment"


@pytest.fixture
def echo_env(tmp_path, monkeypatch):
    """The echo environment `openenv init` generates from openenv-core's own template."""
    pytest.importorskip("openenv", reason="optional extra: pip install 'cadence[envs-openenv]'")
    from openenv.cli.__main__ import app as openenv_cli

    result = CliRunner().invoke(openenv_cli, ["init", "echo_env", "--output-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m == "echo_env" or m.startswith("echo_env.")]:
        del sys.modules[name]


@pytest.fixture
def echo_server(echo_env):
    """The echo environment served by openenv-core's own server, as `openenv serve` or Docker would."""
    import uvicorn
    from echo_env.models import EchoAction, EchoObservation
    from echo_env.server.echo_env_environment import EchoEnvironment
    from openenv.core.env_server.http_server import create_app

    served = create_app(EchoEnvironment, EchoAction, EchoObservation, env_name="echo_env", max_concurrent_envs=64)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(served, log_level="critical"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)


def echo_steps(name: str) -> list:
    cfg = EnvConfig(name=name, max_turns=2)
    return play(cfg, lambda observation: f"heard: {observation}")


def test_openenv_class_in_process(echo_env):
    first, second = echo_steps(ECHO)
    assert first.observation == "heard: Echo Env environment ready!" and first.reward == pytest.approx(3.4)
    assert second.truncated and second.observation == "heard: heard: Echo Env environment ready!"


def test_openenv_server_over_its_websocket(echo_server):
    first, second = echo_steps(f"openenv:{echo_server}")
    assert first.observation == "heard: Echo Env environment ready!" and first.reward == pytest.approx(3.4)
    assert second.truncated and not second.terminated


def test_openenv_bad_names_are_one_line(echo_env):
    line = config_error("env.name=openenv:echo_env.server.echo_env_environment:EchoEnv")
    assert "has no class 'EchoEnv'. Did you mean: EchoEnvironment?" in line
    assert "is not an OpenEnv Environment class" in config_error("env.name=openenv:echo_env.models:EchoAction")
    assert "expected a server address" in config_error("env.name=openenv:localhost")
    assert "env.kwargs.action_field: the action has no field 'text'" in config_error(
        f"env.name={ECHO}", "env.kwargs.action_field=text"
    )


def test_openenv_server_trains_two_steps(echo_server, tmp_path):
    steps = train_two_steps(tmp_path, f"env.name=openenv:{echo_server}")
    assert steps[0]["reward/mean"] > 0  # the echo pays 0.1 per character


# ------------------------------------------------------------------ verifiers (its v1 API, 0.4)

VF_SUMS = """
import verifiers.v1 as vf


class SumsData(vf.TaskData):
    answer: str


class SumsTask(vf.Task[SumsData]):
    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == self.data.answer)

    @vf.reward(weight=0.1)
    async def replied(self, trace: vf.Trace) -> float:
        return float(trace.num_turns >= 1)


class SumsConfig(vf.TasksetConfig):
    count: int = 8


class SumsTaskset(vf.Taskset[SumsTask, SumsConfig]):
    def load(self):
        for a in range(10, 10 + self.config.count):
            yield SumsTask(SumsData(prompt=f"{a}+21=", answer=str(a + 21), id=f"sum-{a}"), self.config.task)


__all__ = ["SumsTaskset"]
"""

# vf-eval vf_sums --env.taskset.count 4 --env.agent.harness.id null --env.agent.runtime.type subprocess
LOCAL_CHAT = {"taskset": {"count": 4}, "agent": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}}
VERIFIERS_AGENT = [
    "model.path=builtin:calc",  # a chat template: the null harness's program speaks chat completions
    "agent.name=python:cadence.envs.hubs.verifiers:run", "agent.tasks=seeds",
    'agent.kwargs.env_config={taskset: {count: 4}, agent: {harness: {id: "null"}, runtime: {type: subprocess}}}',
    "agent.kwargs.sampling={max_tokens: 8}",
]


@pytest.fixture
def vf_sums(tmp_path, monkeypatch):
    """A verifiers taskset as the Environments Hub installs them: a module exporting its Taskset."""
    pytest.importorskip("verifiers", minversion="0.4", reason="optional extra: pip install 'cadence[envs-verifiers]'")
    (tmp_path / "vf_sums.py").write_text(VF_SUMS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "vf_sums"
    sys.modules.pop("vf_sums", None)


def test_verifiers_tasks_by_seed_idx_or_id_after_select(vf_sums):
    from cadence.envs.hubs.verifiers import environment, task_of, tasks

    assert type(environment(vf_sums, LOCAL_CHAT)).__name__ == "SingleAgentEnv"
    played = tasks(vf_sums, LOCAL_CHAT)
    assert [t.data.prompt for t in played] == ["10+21=", "11+21=", "12+21=", "13+21="]
    assert task_of(played, 6).data.prompt == "12+21="  # 6 % 4
    assert task_of(played, {"idx": 1}).data.answer == "32"
    assert task_of(played, {"id": "sum-13"}).data.idx == 3
    selected = tasks(vf_sums, LOCAL_CHAT, {"skip": 1, "limit": 2})  # vf-eval --select.skip 1 -n 2
    assert [task_of(selected, seed).data.idx for seed in range(4)] == [1, 2, 1, 2]
    with pytest.raises(ValueError, match="no task of the taskset has idx=9"):
        task_of(played, {"idx": 9})
    with pytest.raises(ValueError, match="plays agent.tasks=seeds"):
        task_of(played, "10+21=")


def test_verifiers_settings_that_cannot_work_are_one_line(vf_sums, monkeypatch):
    from cadence.envs.hubs import verifiers as adapter

    line = config_error(f"env.name=verifiers:{vf_sums}")
    assert f"train as agents: drop env.name and set agent.name=python:cadence.envs.hubs.verifiers:run " \
           f"agent.kwargs.env={vf_sums}" in line
    # YAML reads `id: null` as nothing, which verifiers would take for its default harness (bash)
    with pytest.raises(ValueError, match='agent.kwargs.env_config.agent.harness.id is null: .* id: "null"'):
        adapter.environment(vf_sums, {"agent": {"harness": {"id": None}}})
    with pytest.raises(ValueError, match=r"agent.kwargs.env_config of 'vf_sums': taskset.count: .*integer") as bad:
        adapter.environment(vf_sums, {"taskset": {"count": "many"}})
    assert "\n" not in str(bad.value)
    with pytest.raises(ValueError, match="agent.kwargs.select: limit: Input should be greater than or equal to 1"):
        adapter.tasks(vf_sums, LOCAL_CHAT, {"limit": 0})  # vf-eval -n 0
    with pytest.raises(ValueError, match=r"agent.kwargs.env='vf_nope': taskset 'vf_nope' not found") as missing:
        adapter.environment("vf_nope")
    assert "\n" not in str(missing.value)
    monkeypatch.setattr(adapter, "version_of", lambda hub: "0.3.1")
    with pytest.raises(ImportError, match=r"needs verifiers>=0.4,<0.5 \(its v1 API\), found verifiers 0.3.1: "
                                          r"pip install 'cadence\[envs-verifiers\]'"):
        adapter.environment("vf_other")


def test_a_rollout_that_failed_inside_verifiers_raises_its_cause_in_one_line():
    pytest.importorskip("verifiers", minversion="0.4", reason="optional extra: pip install 'cadence[envs-verifiers]'")
    import verifiers.v1 as vf

    from cadence.envs.hubs.verifiers import episode_reward

    failed = vf.Error(type="HarnessError", message="harness 'null' exited 1: Traceback (most recent call last):\n"
                                                   "  File \"chat.py\", line 3\nConnectionError: refused")
    episode = vf.Episode(task=vf.TraceTask(type="SumsTask", data=vf.TaskData()), errors=[failed])
    with pytest.raises(RuntimeError) as raised:
        episode_reward("vf_sums", episode)
    assert str(raised.value) == "verifiers rollout of 'vf_sums' failed: HarnessError: harness 'null' exited 1: " \
                                "Traceback (most recent call last): ... ConnectionError: refused"


@pytest.mark.slow  # each episode's harness program is a python process (~30 s for 2 steps)
def test_verifiers_environment_trains_two_steps_through_the_agent_endpoint(vf_sums, tmp_path):
    cfg = load_config(None, [*QUICK_RUN, *VERIFIERS_AGENT, f"agent.kwargs.env={vf_sums}", "trainer.steps=2",
                             f"logging.run_dir={tmp_path}/run"])
    summary = train(cfg)
    records = read_jsonl(summary.run_dir / "metrics.jsonl")
    steps = [r for r in records if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    # every episode's harness program reached the model through verifiers' interception and
    # cadence's endpoint, and every request was trained
    assert steps[-1]["agent/runs_played_total"] >= 32 and steps[-1]["agent/runs_lost_total"] == 0
    assert steps[-1]["agent/samples_total"] >= 32 and all(r["train/response_tokens"] > 0 for r in steps)
    assert all(r["reward/mean"] >= 0.1 for r in steps)  # the taskset's rewards: 0.1 for a reply, +1 if right


def test_a_verifiers_environment_that_is_not_installed_stops_the_run_in_one_line(vf_sums, tmp_path):
    from cadence.rollout.failures import ProducerFailing

    cfg = load_config(None, [*QUICK_RUN, *VERIFIERS_AGENT, "agent.kwargs.env=vf_nope", "trainer.steps=2",
                             f"logging.run_dir={tmp_path}/run"])
    with pytest.raises(ProducerFailing, match="agent.kwargs.env='vf_nope': taskset 'vf_nope' not found") as failing:
        train(cfg)
    assert "\n" not in str(failing.value)
