"""`cadence train --resume`: a killed synchronous run continues bit-identically, and a
changed config is refused unless the changed fields are named (then recorded)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from cadence.config import ConfigError, load_config
from cadence.observe.metrics import read_jsonl
from cadence.recipes.train_rlvr import prepare_run_dir, train
from cadence.train.resume import check_resume_config, config_changes, split_allow
from tests.quick_run import QUICK_RUN

# The built-in model gets some sums right, so rewards vary and every step changes the weights;
# one torch thread everywhere, so the uninterrupted and the resumed run do the same float ops.
RUN = [*QUICK_RUN, "trainer.steps=6", "checkpoint.every=2", "checkpoint.keep=5", "runtime.threads=1"]
# The config checks need a checkpoint, not learning: the smallest batch that trains.
CHECKPOINTED = [*QUICK_RUN, "rollout.prompts_per_step=2", "rollout.group_size=2"]
COMPARED = ("reward/mean", "response/length_mean", "train/loss", "train/grad_norm", "train/entropy")


def _records(run: Path) -> list[dict]:
    return read_jsonl(run / "metrics.jsonl")


def _cadence(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "cadence", "train", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_sync_resume_after_sigkill_is_bit_identical(tmp_path):
    whole = tmp_path / "whole"
    train(load_config(None, [*RUN, f"logging.run_dir={whole}"]))

    run = tmp_path / "killed"
    args = [*RUN, f"logging.run_dir={run}"]
    proc = _cadence(args, tmp_path)
    deadline = time.time() + 240
    while time.time() < deadline and not (run / "checkpoints" / "step_2").exists():
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (run / "checkpoints" / "step_6").exists(), "killed too late to test anything"

    resumed = _cadence([*args, "--resume"], tmp_path)
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    assert "resumed from step" in out

    a, b = _records(whole), _records(run)
    assert [r["step"] for r in b] == [r["step"] for r in a] == list(range(1, 7))
    for ra, rb in zip(a, b, strict=True):
        for key in COMPARED:
            assert ra[key] == rb[key], (ra["step"], key, ra[key], rb[key])
    # The dashboard's files are cut back too: each step's samples and staleness appear once.
    steps_a = [json.loads(x)["step"] for x in (whole / "samples.jsonl").read_text().splitlines()]
    steps_b = [json.loads(x)["step"] for x in (run / "samples.jsonl").read_text().splitlines()]
    assert steps_b == steps_a and sorted(set(steps_a)) == list(range(1, 7))
    staleness = read_jsonl(run / "events" / "trainer.jsonl")
    assert [e["step"] for e in staleness if e.get("kind") == "staleness"] == list(range(1, 7))
    wa = load_file(whole / "checkpoints" / "step_6" / "model.safetensors")
    wb = load_file(run / "checkpoints" / "step_6" / "model.safetensors")
    assert wa.keys() == wb.keys()
    assert all((wa[k] == wb[k]).all() for k in wa)


@pytest.mark.slow
def test_an_adaptive_kl_run_resumes_with_its_own_command(tmp_path):
    """algorithm.kl.target moves the KL coefficient step by step: trainer state, never the config,
    so `--resume` with the command that started the run continues it, coefficient and all."""
    args = [*RUN, "trainer.steps=4", "algorithm.kl.coef=0.05", "algorithm.kl.mode=loss", "algorithm.kl.target=0.001",
            f"logging.run_dir={tmp_path}/run"]
    cfg = load_config(None, args)
    train(cfg)
    assert cfg.algorithm.kl.coef == 0.05, "the trainer wrote its coefficient into the run config"
    run = cfg.run_dir()
    whole = _records(run)
    assert len({r["train/kl_coef"] for r in whole}) == 4 and whole[0]["train/kl_coef"] != 0.05  # it adapts

    shutil.rmtree(run / "checkpoints" / "step_4")  # as if killed after step 2's checkpoint
    train(load_config(None, args), resume=True)
    resumed = _records(run)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for ra, rb in zip(whole, resumed, strict=True):
        for key in ("train/kl_coef", *COMPARED):
            assert ra[key] == rb[key], (ra["step"], key, ra[key], rb[key])


def _checkpointed_run(tmp_path: Path, overrides: list[str]) -> Path:
    """A run folder with one finished 2-step checkpoint (no engine needed to make it)."""
    cfg = load_config(None, [*CHECKPOINTED, "trainer.steps=2", f"logging.run_dir={tmp_path}/run", *overrides])
    train(cfg)
    return cfg.run_dir()


def test_resume_refuses_a_changed_config_and_records_allowed_changes(tmp_path):
    run = _checkpointed_run(tmp_path, ["algorithm.loss=grpo"])
    original = (run / "config.yaml").read_text()
    base = [*CHECKPOINTED, f"logging.run_dir={run}"]

    changed = load_config(None, [*base, "trainer.steps=4", "algorithm.loss=cispo"])
    with pytest.raises(ConfigError) as err:
        prepare_run_dir(changed, resume=True)
    message = str(err.value)
    assert "\n" not in message
    assert "algorithm.loss ('grpo' -> 'cispo')" in message and "trainer.steps (2 -> 4)" in message
    assert "--allow-change algorithm.loss," in message and message.endswith(",trainer.steps")
    assert not (run / "resume_changes.yaml").exists()

    with pytest.raises(ConfigError, match="algorithm.loss"):  # allowing one field is not enough
        prepare_run_dir(changed, resume=True, allow_change=["trainer.steps"])

    # cispo also changes its default algorithm.mismatch.mode: allow the whole section.
    prepare_run_dir(changed, resume=True, allow_change=["trainer", "algorithm"])
    entries = yaml.safe_load((run / "resume_changes.yaml").read_text())
    assert entries[0]["resumed_at_step"] == 2
    assert entries[0]["changes"]["algorithm.loss"] == {"from": "grpo", "to": "cispo"}
    assert entries[0]["changes"]["trainer.steps"] == {"from": 2, "to": 4}
    assert (run / "config.yaml").read_text() == original, "the run's original config was overwritten"

    same = load_config(None, [*base, "trainer.steps=2", "algorithm.loss=grpo", "logging.progress=true"])
    prepare_run_dir(same, resume=True)  # unchanged (progress bars only change what is shown)


def test_config_changes_and_allow_lists():
    assert config_changes({"a": {"b": 1, "c": [1, 2]}}, {"a": {"b": 2, "c": [1, 2]}}) == {
        "a.b": {"from": 1, "to": 2}
    }
    assert split_allow(["trainer.steps,trainer.lr", " logging "]) == ["trainer.steps", "trainer.lr", "logging"]
    # A section allows its fields, but not a field whose name merely starts the same way.
    assert check_resume_config({"trainer": {"lr": 1}}, {"trainer": {"lr": 2}}, ["trainer"], "c") == {
        "trainer.lr": {"from": 1, "to": 2}
    }
    with pytest.raises(ConfigError):
        check_resume_config({"trainer": {"lr": 1}}, {"trainer": {"lr": 2}}, ["train"], "c")


def test_a_field_newer_than_the_checkpoint_is_allowed_only_at_its_default():
    saved, defaults = {"trainer": {"lr": 1}}, {"trainer": {"lr": 1, "new": False}}
    added = {"trainer.new": {"from": None, "to": False}}
    assert check_resume_config(saved, {"trainer": {"lr": 1, "new": False}}, [], "c", defaults) == added
    with pytest.raises(ConfigError, match=r"trainer.new \(None -> True\)"):  # not its default: a real change
        check_resume_config(saved, {"trainer": {"lr": 1, "new": True}}, [], "c", defaults)
    with pytest.raises(ConfigError, match="trainer.new"):  # a field the checkpoint had is compared as ever
        check_resume_config({"trainer": {"lr": 1, "new": True}}, {"trainer": {"lr": 1, "new": False}}, [], "c",
                            defaults)


def test_resume_a_checkpoint_saved_before_a_field_existed(tmp_path):
    run = _checkpointed_run(tmp_path, [])
    saved_file = run / "checkpoints" / "step_2" / "run_config.yaml"
    saved = yaml.safe_load(saved_file.read_text())
    del saved["trainer"]["bf16_autocast"]  # as written by a cadence without the field
    saved_file.write_text(yaml.safe_dump(saved))
    prepare_run_dir(load_config(None, [*CHECKPOINTED, "trainer.steps=2", f"logging.run_dir={run}"]), resume=True)
    entries = yaml.safe_load((run / "resume_changes.yaml").read_text())
    assert list(entries[0]["changes"]) == ["trainer.bf16_autocast"]  # recorded, not refused
    with pytest.raises(ConfigError, match=r"--resume: .*trainer.bf16_autocast \(None -> True\)"):
        prepare_run_dir(load_config(None, [*CHECKPOINTED, "trainer.steps=2", f"logging.run_dir={run}",
                                           "trainer.bf16_autocast=true"]), resume=True)


def test_rollout_workers_cannot_change_on_resume_even_when_allowed():
    saved, current = {"runtime": {"rollout_workers": 2}}, {"runtime": {"rollout_workers": 4}}
    with pytest.raises(ConfigError, match="runtime.rollout_workers cannot change on resume"):
        check_resume_config(saved, current, ["runtime"], "c")
