"""EnvConfig: names, python: classes, kwargs and latency, with errors that name the fix."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from cadence.envs import EnvConfig, EnvRunner
from cadence.envs.build import env_factory
from cadence.envs.registry import BUILTIN_ENVS, describe, resolve_env_class

NOT_AN_ENV = """
class NoStep:
    def reset(self, seed):
        return "x", {}

class WrongReset:
    def reset(self):
        return "x", {}
    def step(self, action):
        return "x", 0.0, True, False, {}

class Fine:
    action_tag = None
    def __init__(self, size=3):
        self.size = size
    def reset(self, seed):
        return f"size {self.size}", {}
    def step(self, action):
        return action.upper(), 1.0, True, False, {}
"""


@pytest.fixture
def env_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_envs.py"
    path.write_text(NOT_AN_ENV)
    return path


def test_every_field_is_described_and_defaults_validate():
    for model in (EnvConfig, EnvConfig.model_fields["latency"].annotation):
        assert all(f.description for f in model.model_fields.values()), model
    assert EnvConfig().name == "frozenlake"
    assert all(name in describe() for name in BUILTIN_ENVS)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"name": "sokoban2"}, "is unknown; did you mean 'sokoban'\\? Built-ins: frozenlake"),
        ({"name": "python:{file}:NoStep"}, "not an environment class: it has no step\\(\\) method"),
        ({"name": "python:{file}:WrongReset"}, "reset\\(\\) must take \\(seed: int\\)"),
        ({"name": "python:{file}:Fien"}, "has no class 'Fien'. Did you mean: Fine"),
        ({"name": "python:{dir}/missing.py:Fine"}, "file not found"),
        ({"name": "python:no_such_env_module:Env"}, "importing 'no_such_env_module' failed"),
        ({"name": "python:{file}:Fine", "kwargs": {"sise": 2}}, "env.kwargs.sise: unknown argument; did you mean 'size'"),
        ({"name": "frozenlake", "kwargs": {"size": 4, "slipery": True}}, "did you mean 'slippery'"),
        ({"latency": {"fail_slow_share": 0.6, "fail_stop_share": 0.6}}, "must be at most 1"),
        ({"action_tag": "<answer>"}, "plain tag name"),
        ({"max_turn": 3}, "Extra inputs are not permitted"),
        ({"name": "gymnasium"}, "missing a required argument: 'id'"),
        ({"name": "gymnasium", "kwargs": {"id": "CartPole-v0x"}}, "did you mean 'CartPole-v0'"),
    ],
)
def test_config_errors_name_the_field_and_the_fix(env_file, settings, message):
    settings = {
        k: (v.format(file=env_file, dir=env_file.parent) if isinstance(v, str) else v)
        for k, v in settings.items()
    }
    with pytest.raises(ValidationError, match=message):
        EnvConfig(**settings)


def test_python_env_from_a_file_runs_through_the_runner(env_file):
    cfg = EnvConfig(name=f"python:{env_file}:Fine", kwargs={"size": 5}, format_penalty=0.5)
    assert resolve_env_class(cfg.name).__name__ == "Fine"
    assert env_factory(cfg)().size == 5

    async def main():
        runner = EnvRunner.from_config(cfg)
        assert runner.action_tag is None  # 'auto' took the class's own tag
        assert (await runner.reset(0)).observation == "size 5"
        assert (await runner.step("whole reply")).observation == "WHOLE REPLY"

    asyncio.run(main())


def test_auto_action_tag_and_latency_wrapper_from_config():
    runner = EnvRunner.from_config(EnvConfig(name="sokoban", max_turns=3))
    assert runner.action_tag == "answer" and runner.max_turns == 3
    assert EnvRunner.from_config(EnvConfig(name="code")).action_tag is None
    plain = env_factory(EnvConfig(name="sokoban"))()
    slowed = env_factory(EnvConfig(name="sokoban", latency={"mean_s": 0.01}))()
    assert type(plain).__name__ == "SokobanEnv" and type(slowed).__name__ == "LatencyEnv"
    assert slowed.env.width == plain.width and slowed.mean_s == 0.01


def test_cadence_envs_lists_each_builtin_on_one_line():
    from typer.testing import CliRunner

    from cadence.cli import app

    result = CliRunner().invoke(app, ["envs"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for name in BUILTIN_ENVS:
        assert sum(line.split()[:1] == [name] for line in lines) == 1, name
    assert any(line.split()[:1] == ["latency"] for line in lines)


def test_textarena_without_the_extra_is_a_config_error_naming_the_install(monkeypatch):
    import sys

    for name in [m for m in sys.modules if m == "textarena" or m.startswith("textarena.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "textarena", None)  # import textarena now fails
    with pytest.raises(ValidationError, match=r"needs TextArena: pip install 'cadence\[envs-textarena\]'"):
        EnvConfig(name="textarena", kwargs={"id": "GuessTheNumber-v0"})
