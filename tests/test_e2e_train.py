"""End-to-end `cadence train` runs: HF round trip, and SIGKILL + --resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from cadence.config import load_config
from cadence.observe.metrics import read_jsonl
from cadence.recipes.train_rlvr import train
from tests.quick_run import QUICK_RUN

pytestmark = pytest.mark.slow

SMALL = [*QUICK_RUN, "rollout.max_new_tokens=6"]


def varied_reward(tmp_path: Path) -> str:
    """A random model never gets arithmetic right; reward something it does vary on."""
    f = tmp_path / "varied_reward.py"
    f.write_text("def reward(prompt, response):\n    return float(len(response) % 2)\n")
    return f"reward.name=python:{f}:reward"


def test_qwen2_folder_trains_and_checkpoint_loads_in_plain_transformers(tiny_qwen2_dir, tmp_path):
    cfg = load_config(
        None,
        [*SMALL, f"model.path={tiny_qwen2_dir}", "trainer.steps=2", "trainer.lr=1e-2",
         f"logging.run_dir={tmp_path}/run", varied_reward(tmp_path)],
    )
    summary = train(cfg)
    ckpt = summary.run_dir / "checkpoints" / "step_2"
    trained = AutoModelForCausalLM.from_pretrained(ckpt)
    original = AutoModelForCausalLM.from_pretrained(tiny_qwen2_dir)
    assert type(trained).__name__ == "Qwen2ForCausalLM"
    changed = [
        n for (n, a), (_, b) in zip(trained.named_parameters(), original.named_parameters(), strict=True)
        if not torch.equal(a, b)
    ]
    assert changed, "training left every weight unchanged"
    records = read_jsonl(summary.run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for key in ("reward/mean", "reward/accuracy", "response/length_mean", "train/loss", "train/entropy",
                "train/grad_norm", "perf/samples_per_s", "perf/tokens_per_s", "time/step"):
        assert key in records[0], key


def _cadence(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "cadence", "train", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_sigkill_then_resume_has_no_gaps_or_duplicates(tiny_llama_dir, tmp_path):
    run = tmp_path / "run"
    args = [*SMALL, f"model.path={tiny_llama_dir}", "trainer.steps=12", "checkpoint.every=3",
            f"logging.run_dir={run}"]
    proc = _cadence(args, tmp_path)
    deadline = time.time() + 240
    while time.time() < deadline and not (run / "checkpoints" / "step_6").exists():
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (run / "checkpoints" / "step_6").exists()

    resumed = _cadence([*args, "--resume"], tmp_path)
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    assert "resumed from step" in out
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 13))
    samples = [json.loads(x)["progress/samples_total"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert samples == [16.0 * s for s in range(1, 13)]


def test_default_run_raises_held_out_accuracy_by_15_points(tmp_path):
    """The README's promise: `cadence train` on its defaults makes the built-in model better."""
    cfg = load_config(None, ["logging.progress=false", "logging.tensorboard=false", f"logging.run_dir={tmp_path}"])
    summary = train(cfg)
    assert summary.eval_after.pass_at_1 - summary.eval_before.pass_at_1 >= 0.15
    assert (summary.run_dir / "reward_curve.png").stat().st_size > 10_000
