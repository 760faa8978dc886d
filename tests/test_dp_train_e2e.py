"""`cadence train` with two FSDP trainer ranks: finishes, exports a checkpoint plain
transformers loads, logs the weight-sync time, and resumes with one rank."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from cadence.config import load_config
from cadence.observe.metrics import read_jsonl
from cadence.recipes.train_rlvr import train
from cadence.train.checkpoint import SHARDED_DIR, load_state
from tests.quick_run import QUICK_RUN


@pytest.mark.slow
def test_cadence_train_with_two_fsdp_ranks_then_resume_with_one(tmp_path):
    run = tmp_path / "run"
    args = [*QUICK_RUN, "runtime.trainer_workers=2", "trainer.strategy=fsdp", "trainer.steps=3",
            f"logging.run_dir={run}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, "-m", "cadence", "train", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr

    step_3 = run / "checkpoints" / "step_3"
    model = AutoModelForCausalLM.from_pretrained(step_3)  # the HF export: plain transformers
    assert (step_3 / SHARDED_DIR).is_dir() and "optimizer" not in load_state(step_3)["trainer"]
    records = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["perf/weight_sync_s"] > 0 for r in records)

    # One rank picks the run up from the two ranks' shards (optimizer resharded) and goes on.
    cfg = load_config(None, [*QUICK_RUN, "trainer.steps=4", f"logging.run_dir={run}"])
    assert cfg.runtime.trainer_workers == 1
    train(cfg, resume=True, allow_change=["runtime.trainer_workers", "trainer.steps", "trainer.strategy"])
    after = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_4")
    moved = [not torch.equal(a, b) for a, b in zip(model.parameters(), after.parameters(), strict=True)]
    assert any(moved)
    assert load_state(run / "checkpoints" / "step_4")["trainer"]["version"] == 4
