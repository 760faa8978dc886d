"""Config loading: YAML + dotted overrides, and errors that name the field and the fix."""

from __future__ import annotations

import pytest

from cadence.config import ConfigError, RunKind, load_config, parse_override


def test_defaults_load_and_overrides_apply(tiny_llama_dir):
    cfg = load_config(None, [f"model.path={tiny_llama_dir}", "trainer.lr=3e-4", "rollout.group_size=4"])
    assert cfg.trainer.lr == pytest.approx(3e-4)
    assert cfg.rollout.group_size == 4
    assert cfg.batch_size == cfg.rollout.prompts_per_step * 4


def test_yaml_file_then_overrides_win(tmp_path, tiny_llama_dir):
    f = tmp_path / "run.yaml"
    f.write_text(f"model:\n  path: {tiny_llama_dir}\ntrainer:\n  steps: 7\n  lr: 0.01\n")
    cfg = load_config(f, ["trainer.lr=0.02"])
    assert cfg.trainer.steps == 7 and cfg.trainer.lr == pytest.approx(0.02)


def test_parse_override_types():
    assert parse_override("a.b=3") == (["a", "b"], 3)
    assert parse_override("a=true") == (["a"], True)
    assert parse_override("a=[1, 2]") == (["a"], [1, 2])
    with pytest.raises(ConfigError, match="key.sub=value"):
        parse_override("novalue")


def test_unknown_key_suggests_the_close_one(tiny_llama_dir):
    with pytest.raises(ConfigError, match=r"trainer\.lrr: unknown key; did you mean 'lr'"):
        load_config(None, [f"model.path={tiny_llama_dir}", "trainer.lrr=0.1"])


def test_wrong_type_names_the_field(tiny_llama_dir):
    with pytest.raises(ConfigError, match=r"trainer\.steps"):
        load_config(None, [f"model.path={tiny_llama_dir}", "trainer.steps=many"])


def test_missing_model_path_is_reported_before_loading(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.path: no such folder"):
        load_config(None, [f"model.path={tmp_path / 'nope'}"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        load_config(None, [f"model.path={tmp_path / 'empty'}"])


def test_impossible_batch_arithmetic(tiny_llama_dir):
    base = [f"model.path={tiny_llama_dir}", "rollout.prompts_per_step=3", "rollout.group_size=4"]
    with pytest.raises(ConfigError, match="micro_batch_size=5 does not divide"):
        load_config(None, [*base, "trainer.micro_batch_size=5"])
    with pytest.raises(ConfigError, match="mini_batches=5 does not divide"):
        load_config(None, [*base, "trainer.mini_batches=5"])
    with pytest.raises(ConfigError, match="group_size to 2 or more"):
        load_config(None, [f"model.path={tiny_llama_dir}", "rollout.group_size=1"])


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_runtime_cross_checks_take_only_the_sections_they_read():
    """`check_runtime` runs on the sections alone (no RunConfig), with load_config's messages."""
    from cadence.algo.config import AlgorithmConfig
    from cadence.rollout.config import RolloutConfig
    from cadence.runtime.config import RuntimeConfig, check_runtime
    from cadence.train.config import TrainerConfig

    check_runtime(RuntimeConfig(), RolloutConfig(), TrainerConfig(), AlgorithmConfig())  # the defaults fit
    with pytest.raises(ValueError, match=r"runtime.rollout_workers > 1 needs runtime.kind=ray"):
        check_runtime(RuntimeConfig(rollout_workers=2), RolloutConfig(), TrainerConfig(), AlgorithmConfig())
    few_prompts = RolloutConfig(prompts_per_step=2, replicate_prompts=False)
    with pytest.raises(ValueError, match="rollout.prompts_per_step=2 is smaller than runtime.rollout_workers=4"):
        check_runtime(RuntimeConfig(kind="ray", rollout_workers=4), few_prompts, TrainerConfig(), AlgorithmConfig())
    with pytest.raises(ConfigError, match="rollout.prompts_per_step=2 is smaller than runtime.rollout_workers=4"):
        load_config(None, ["runtime.kind=ray", "runtime.rollout_workers=4", "rollout.prompts_per_step=2",
                           "rollout.replicate_prompts=false"])


def test_unknown_key_in_an_optional_section_gets_a_suggestion():
    """`env` and `rollout.simulate_lengths` are `X | None`: the hint still names the closest field."""
    with pytest.raises(ConfigError, match=r"env.max_turn: unknown key; did you mean 'max_turns'\?"):
        load_config(None, ["env.name=frozenlake", "env.max_turn=3"])
    with pytest.raises(ConfigError, match=r"rollout.simulate_lengths.sigmaa: unknown key; did you mean 'sigma'\?"):
        load_config(None, ["rollout.simulate_lengths.sigmaa=1"])


def test_run_kind_says_what_a_runs_groups_are_made_of(tmp_path):
    (tmp_path / "agent.py").write_text("async def run(client, task):\n    return 0.0\n")
    sections = ([], ["env.name=frozenlake"], [f"agent.name=python:{tmp_path / 'agent.py'}:run"])
    kinds = [load_config(None, overrides).run_kind for overrides in sections]
    assert kinds == [RunKind.RLVR, RunKind.EPISODES, RunKind.AGENTS]
    assert [kind.plays_episodes for kind in kinds] == [False, True, True]
