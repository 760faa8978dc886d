"""`cadence simulate` from the command line."""

from __future__ import annotations

from typer.testing import CliRunner

from cadence.cli import app

TINY = ["cluster.gpus=4", "rollout.gpus_per_worker=1", "workload.prompts_per_step=4", "workload.group_size=2",
        "workload.median_tokens=256", "workload.max_tokens=2048", "run.steps=2", "run.warmup_steps=1"]


def test_simulate_compare_and_split_print_tables():
    runner = CliRunner()
    result = runner.invoke(app, ["simulate", "compare", *TINY])
    assert result.exit_code == 0, result.output
    assert "| gpus | train_gpus | sync_samples_per_s" in result.output
    result = runner.invoke(app, ["simulate", "split", "--train-gpus", "1,2", *TINY])
    assert result.exit_code == 0, result.output
    assert result.output.count("\n| ") >= 3  # header + two rows


def test_simulate_presets_and_errors():
    runner = CliRunner()
    result = runner.invoke(app, ["simulate", "presets"])
    assert "qwen3-8b-think" in result.output
    result = runner.invoke(app, ["simulate", "compare", "cluster.gpu=4"])
    assert result.exit_code == 2 and "cluster.gpu: unknown key" in result.output
    result = runner.invoke(app, ["simulate", "alpha", "--alphas", "one"])
    assert result.exit_code == 2 and "--alphas" in result.output
