"""Run folders: a new one per `cadence train` unless logging.name is given; `--resume` finds the latest."""

from __future__ import annotations

import os
import time

import pytest
from typer.testing import CliRunner

from cadence.cli import app
from cadence.config import ConfigError, load_config
from cadence.observe.run_name import choose_run_name, latest_run, named_explicitly
from tests.quick_run import QUICK_RUN


def _started(run_dir, when: float) -> None:
    """A run folder as `cadence train` leaves it: config.yaml written at its start."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("{}\n")
    os.utime(run_dir / "config.yaml", (when, when))


def test_each_fresh_run_gets_its_own_folder(tmp_path):
    template = f"logging.run_dir={tmp_path}/{{name}}"
    first = load_config(None, [template])
    assert not named_explicitly(first.logging)
    choose_run_name(first.logging, resume=False)
    first.run_dir().mkdir()
    second = load_config(None, [template])
    second.logging.name = first.logging.name  # started in the same second
    second.logging.model_fields_set.discard("name")
    choose_run_name(second.logging, resume=False)
    assert second.run_dir() != first.run_dir() and not second.run_dir().exists()
    assert second.logging.name == f"{first.logging.name}-2"


def test_resume_without_a_name_continues_the_latest_started_run(tmp_path):
    now = time.time()
    _started(tmp_path / "zzz-old", now - 100)  # sorts last by name, started first
    _started(tmp_path / "2026-01-01_00-00-00", now)
    (tmp_path / "not-a-run").mkdir()
    assert latest_run(tmp_path) == tmp_path / "2026-01-01_00-00-00"
    cfg = load_config(None, [f"logging.run_dir={tmp_path}/{{name}}"])
    choose_run_name(cfg.logging, resume=True)
    assert cfg.run_dir() == tmp_path / "2026-01-01_00-00-00"


def test_a_template_with_text_around_the_name_resumes_its_own_runs(tmp_path):
    now = time.time()
    _started(tmp_path / "frozenlake-a", now - 10)
    _started(tmp_path / "sokoban-b", now)  # newer, but another example's
    cfg = load_config(None, [f"logging.run_dir={tmp_path}/frozenlake-{{name}}"])
    choose_run_name(cfg.logging, resume=True)
    assert cfg.logging.name == "a" and cfg.run_dir() == tmp_path / "frozenlake-a"


def test_resume_with_no_run_to_continue_says_so(tmp_path):
    cfg = load_config(None, [f"logging.run_dir={tmp_path}/runs/{{name}}"])
    with pytest.raises(ConfigError, match="no run to continue matching"):
        choose_run_name(cfg.logging, resume=True)


def test_an_explicit_name_or_fixed_folder_is_kept(tmp_path):
    _started(tmp_path / "other", time.time())
    named = load_config(None, [f"logging.run_dir={tmp_path}/{{name}}", "logging.name=mine"])
    choose_run_name(named.logging, resume=True)
    assert named.logging.name == "mine"
    fixed = load_config(None, [f"logging.run_dir={tmp_path}/fixed"])
    choose_run_name(fixed.logging, resume=True)
    assert fixed.run_dir() == tmp_path / "fixed"


@pytest.mark.slow
def test_train_twice_then_resume_the_latest_showing_only_the_training_bar(tmp_path, monkeypatch):
    """The README's order: one `cadence train` after another runs, and `--resume` continues the last.
    No transformers weight-loading or shard-writing bar interleaves with the training bar."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()  # as a user's process has them before cadence turns them off
    run = ["train", *QUICK_RUN, "rollout.prompts_per_step=2", "rollout.group_size=2", "trainer.steps=1"]
    try:
        outputs = []
        for _ in range(2):
            result = CliRunner().invoke(app, run)
            assert result.exit_code == 0, result.output
            outputs.append(result.output)
            time.sleep(1.1)  # distinct start times, so "latest" is well defined
            hf_logging.enable_progress_bar()
    finally:
        hf_logging.enable_progress_bar()
    assert not any("Loading weights" in out or "Writing model shards" in out for out in outputs), outputs
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 2 and all((r / "checkpoints" / "step_1").is_dir() for r in runs)
    result = CliRunner().invoke(app, [*run[:-1], "trainer.steps=2", "--resume", "--allow-change", "trainer.steps"])
    assert result.exit_code == 0, result.output
    assert f"resuming the latest run: {runs[-1].relative_to(tmp_path)}" in result.output
    assert (runs[-1] / "checkpoints" / "step_2").is_dir() and not (runs[0] / "checkpoints" / "step_2").exists()


def test_resuming_a_fixed_run_folder_keeps_the_name_it_started_with(tmp_path):
    """logging.run_dir without {name} is one folder; its start-time name must not read as a
    config change on --resume (it did: `--resume: ... logging.name (...) -> (...)`)."""
    fixed = f"logging.run_dir={tmp_path}/run"
    started = load_config(None, [fixed])
    choose_run_name(started.logging, resume=False)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text(f"logging:\n  name: {started.logging.name}\n")
    time.sleep(1.1)  # the resumed run starts later: its start-time name differs
    later = load_config(None, [fixed])
    assert later.logging.name != started.logging.name
    choose_run_name(later.logging, resume=True)
    assert later.logging.name == started.logging.name
