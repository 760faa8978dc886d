"""What a new user hits: each mistake gets one line naming the file or field and the fix, before
any model loads where it can be checked first; quiet behaviours now say what they do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cadence.cli import app, eval_notes
from cadence.config import ConfigError, load_config
from cadence.observe.metrics import read_jsonl
from cadence.observe.report import curve_series
from cadence.observe.reward_errors import RewardErrorReport, RewardFunctionError
from cadence.recipes.evaluate import run_eval
from cadence.recipes.sft import check_output, load_sft_config
from cadence.recipes.train_rlvr import train
from cadence.rewards.guard import RewardGuard
from cadence.rewards.python_reward import PythonReward
from tests.quick_run import QUICK_RUN
from tests.signals import ctrl_c_reaches_it


def _cli(args: list[str]):
    return CliRunner().invoke(app, args)


def _one_line_error(result, *needles: str) -> str:
    """The command failed with exit 2 and a single line holding every needle, no traceback."""
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    text = result.output.strip()
    assert "Traceback" not in text and len(text.splitlines()) == 1, text
    for needle in needles:
        assert needle in text, text
    return text


@pytest.fixture
def no_training(monkeypatch):
    """Any call into training (and so any model load) fails the test."""
    import cadence.recipes.train_rlvr as recipe

    def refuse(*args, **kwargs):
        raise AssertionError("training started: the mistake was not caught before loading")

    monkeypatch.setattr(recipe, "train", refuse)


def test_malformed_yaml_names_file_and_line(tmp_path, no_training):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  lr: 1e-4\n  steps: [3\nrollout:\n  group_size: 4\n")
    _one_line_error(_cli(["train", "--config", str(bad)]), f"{bad}:", "invalid YAML")


def test_folder_as_config_says_so(tmp_path, no_training):
    _one_line_error(_cli(["train", "--config", str(tmp_path)]), str(tmp_path), "is a folder")


def test_config_that_is_not_a_mapping(tmp_path, no_training):
    bad = tmp_path / "list.yaml"
    bad.write_text("- trainer.lr=1\n")
    _one_line_error(_cli(["train", "--config", str(bad)]), "mapping")


def test_override_value_that_is_not_yaml(no_training):
    _one_line_error(_cli(["train", "trainer.betas=[0.9"]), "trainer.betas=[0.9", "quote it")


@pytest.mark.parametrize(
    ("line", "needle"),
    [('{"prompt": "1+1=", "answer": ', "invalid JSON"), ('{"prompt": "1+1="}', "missing field 'answer'")],
)
def test_bad_jsonl_line_is_reported_before_the_model_loads(tmp_path, no_training, line, needle):
    data = tmp_path / "data.jsonl"
    good = "".join(json.dumps({"prompt": f"{i}+1=", "answer": i + 1}) + "\n" for i in range(5))
    data.write_text(good + line + "\n")
    overrides = ["task.name=jsonl", f"task.train_file={data}"]
    _one_line_error(_cli(["train", *overrides]), f"{data}:6", needle)
    _one_line_error(_cli(["eval", "builtin", *overrides]), f"{data}:6", needle)


def test_allow_change_without_resume(no_training):
    _one_line_error(_cli(["train", "--allow-change", "trainer.steps"]), "--allow-change", "--resume")


def _raising_reward(tmp_path: Path, condition: str = "True") -> str:
    f = tmp_path / "my_reward.py"
    f.write_text(
        "def reward(prompt, response):\n"
        f"    if {condition}:\n"
        "        return 1 / 0  # the bug the user must see\n"
        "    return float(response.strip() == prompt.answer)\n"
    )
    return f"reward.name=python:{f}:reward"


def test_reward_that_always_raises_stops_the_run_and_shows_its_traceback(tmp_path):
    run = tmp_path / "run"
    cfg = load_config(None, [*QUICK_RUN, "trainer.steps=20", _raising_reward(tmp_path), f"logging.run_dir={run}"])
    with pytest.raises(RewardFunctionError) as err:
        train(cfg)
    message = str(err.value)
    assert "\n" not in message
    assert "failed on 16 of 16 responses in the first 1 step" in message
    assert "ZeroDivisionError: division by zero" in message and "reward_errors.log" in message
    log = (run / "reward_errors.log").read_text()
    assert "return 1 / 0  # the bug the user must see" in log  # the user's own line, from the traceback
    assert "my_reward.py" in log and "prompt:" in log and "response:" in log
    assert not (run / "checkpoints").exists()


def test_broken_reward_is_caught_by_the_evaluation_before_training(tmp_path):
    result = _cli(
        ["train", *QUICK_RUN, "eval.before=true", _raising_reward(tmp_path), f"logging.run_dir={tmp_path}/run"]
    )
    assert result.exit_code == 2, result.output
    error = next(x for x in result.output.splitlines() if x.startswith("reward.name:"))
    assert "failed on 8 of 8 responses before training" in error
    assert "fn(prompt, response) -> float" in error
    assert "return 1 / 0" in result.output  # the first failure's traceback went to the console


def test_reward_report_stops_only_a_nearly_always_failing_reward(tmp_path):
    report = RewardErrorReport(tmp_path, echo=False)
    first = {"ValueError": {"message": "ValueError: x", "traceback": "Traceback ...", "prompt": "p", "response": "r"}}
    report.check({"calls": 64, "errors": 40, "timeouts": 0, "first_failures": first}, 1)  # 62%: a flaky one
    report.check({"calls": 4, "errors": 4, "timeouts": 0, "first_failures": first}, 1)  # too few to judge
    report.check({"calls": 64, "errors": 64, "timeouts": 0, "first_failures": first}, 4)  # past the first steps
    with pytest.raises(RewardFunctionError, match="60 of 64"):
        report.check({"calls": 64, "errors": 10, "timeouts": 50, "first_failures": first}, 2)
    report.update({"first_failures": first}, 1)
    report.update({"first_failures": first}, 2)  # the same kind is written once
    assert (tmp_path / "reward_errors.log").read_text().count("reward function failure (ValueError") == 1


def test_guard_keeps_the_first_traceback_of_each_kind(tmp_path):
    spec = _raising_reward(tmp_path, "prompt.answer == 'boom'").removeprefix("reward.name=")
    from cadence.data.tasks import Prompt

    with RewardGuard(PythonReward(spec), timeout_s=5) as guard:
        guard.score([(Prompt("a", "x", "boom"), "1"), (Prompt("b", "y", "2"), "2"), (Prompt("c", "z", "boom"), "3")])
        stats = guard.stats()
    assert stats["errors"] == 1 + 1 and set(stats["first_failures"]) == {"ZeroDivisionError"}
    first = stats["first_failures"]["ZeroDivisionError"]
    assert "return 1 / 0" in first["traceback"] and first["prompt"] == "x" and first["response"] == "1"
    assert "guard.py" not in first["traceback"]  # the user's frames, not the guard's


def test_eval_results_go_to_metrics_tensorboard_and_summary(tmp_path):
    run = tmp_path / "run"
    overrides = [*QUICK_RUN, "trainer.steps=2", "eval.before=true", "eval.after=true", "eval.every=1",
                 "logging.tensorboard=true", f"logging.run_dir={run}"]
    result = train(load_config(None, overrides))
    records = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[0]["eval/pass@1"] == result.eval_before.pass_at_1
    assert all("eval/pass@1" in r for r in records[1:])
    assert records[2]["eval/pass@1"] == result.eval_after.pass_at_1
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval_before"]["pass_at_1"] == result.eval_before.pass_at_1
    assert summary["eval_after"]["pass_at_1"] == result.eval_after.pass_at_1
    assert summary["samples_trained"] == 2 * 16
    # `cadence eval` of the last checkpoint, with the run's own config: the numbers training logged
    # for those weights, and nothing added to the run's timeline.
    timeline = {p.name: p.read_bytes() for p in (run / "events").iterdir()}
    held_out = run_eval(load_config(None, [*overrides, f"model.path={run / 'checkpoints' / 'step_2'}"]))
    assert (held_out.pass_at_1, held_out.mean_reward) == (result.eval_after.pass_at_1, result.eval_after.mean_reward)
    assert {p.name: p.read_bytes() for p in (run / "events").iterdir()} == timeline
    events = b"".join(p.read_bytes() for p in (run / "tensorboard").iterdir())
    assert b"eval/pass@1" in events
    assert (run / "reward_curve.png").stat().st_size > 10_000


def test_reward_curve_names_both_reward_and_accuracy():
    same = [{"step": s, "reward/mean": 0.5, "reward/accuracy": 0.5} for s in (1, 2)]
    assert [label for label, _, _ in curve_series(same)] == ["reward/mean = reward/accuracy"]
    partial = [{"step": s, "reward/mean": 0.5, "reward/accuracy": 0.25} for s in (1, 2)]
    assert [label for label, _, _ in curve_series(partial)] == ["reward/mean", "reward/accuracy"]
    assert curve_series([{"step": 0, "eval/pass@1": 0.5}]) == []  # an eval record has no training curve


def test_ctrl_c_says_what_was_saved_and_how_to_resume(tmp_path):
    run = tmp_path / "run"
    args = ["train", *QUICK_RUN, "trainer.steps=200", "checkpoint.every=1", f"logging.run_dir={run}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "cadence", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=ctrl_c_reaches_it)
    deadline = time.time() + 240
    while time.time() < deadline and not (run / "checkpoints" / "step_1").exists():
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert "Traceback" not in out, out
    line = next(x for x in out.splitlines() if x.startswith("interrupted after step"))
    assert "saved: checkpoint" in line and str(run / "checkpoints" / "step_") in line
    command = line.split("Continue with: ", 1)[1]
    assert command.startswith("cadence train ") and command.endswith(" --resume")
    assert f"logging.run_dir={run}" in command


def test_sft_refuses_to_overwrite_an_output_folder(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text("{}")
    cfg = load_sft_config(None, [f"output={out}", "steps=1"])
    with pytest.raises(ConfigError, match="--overwrite"):
        check_output(cfg, overwrite=False)
    check_output(cfg, overwrite=True)
    check_output(load_sft_config(None, [f"output={tmp_path / 'new'}"]), overwrite=False)
    _one_line_error(_cli(["sft", f"output={out}", "steps=1"]), str(out), "--overwrite")


def test_sft_reports_bad_yaml_in_one_line(tmp_path):
    bad = tmp_path / "sft.yaml"
    bad.write_text("steps: [1\n")
    _one_line_error(_cli(["sft", "--config", str(bad)]), f"{bad}:", "invalid YAML")


def test_eval_notes_pass_at_k_at_temperature_zero_and_prints_pass_at_1_once():
    greedy = load_config(None, ["eval.samples=4"])
    assert any("pass@4 = pass@1" in note for note in eval_notes(greedy))
    assert eval_notes(load_config(None, ["eval.samples=4", "eval.temperature=1.0"])) == []
    result = _cli(["eval", "builtin", "task.test_size=4", "eval.samples=2"])
    assert result.exit_code == 0, result.output
    assert "note: eval.samples=2 at eval.temperature=0" in result.output
    result = _cli(["eval", "builtin", "task.test_size=4"])
    assert result.exit_code == 0, result.output
    assert result.output.count("pass@") == 1, result.output


def test_run_folder_given_as_checkpoint_points_to_its_latest_checkpoint(tmp_path, no_training):
    for step in (2, 10):
        (tmp_path / "checkpoints" / f"step_{step}").mkdir(parents=True)
    text = " ".join(_cli(["eval", str(tmp_path)]).output.split())
    assert "is a run folder, not a checkpoint" in text and str(tmp_path / "checkpoints" / "step_10") in text


def test_missing_optional_package_is_named_before_anything_loads(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match="logging.wandb=true needs the 'wandb' package: pip install wandb"):
        load_config(None, ["logging.wandb=true"])


def test_sft_config_given_to_train_says_which_command_takes_it(no_training):
    sft_yaml = Path(__file__).parents[1] / "cadence" / "configs" / "sft_arith.yaml"
    _one_line_error(_cli(["train", "--config", str(sft_yaml)]), "is a `cadence sft` config", "cadence sft --config")


def test_eval_with_a_broken_reward_fails_and_shows_the_traceback(tmp_path):
    result = _cli(["eval", "builtin", "task.test_size=8", _raising_reward(tmp_path)])
    assert result.exit_code == 2, result.output
    error = next(x for x in result.output.splitlines() if x.startswith("reward.name:"))
    assert "failed on 8 of 8 responses on the held-out prompts" in error
    assert "return 1 / 0" in result.output and "pass@1" not in result.output


def test_ci_runs_the_readmes_commands_verbatim():
    """The README tells a new user to run its test command: CI must run exactly that."""
    import re
    import tomllib

    root = Path(__file__).parents[1]
    blocks = re.findall(r"```bash\n(.*?)\n```", (root / "README.md").read_text(), re.DOTALL)
    test_command = next(b for b in blocks if "pytest" in b).strip()
    ci_lines = [line.strip() for line in (root / ".ci" / "run").read_text().splitlines()]
    assert test_command in ci_lines
    # A bare `pytest` must find the tests' own helpers (tests.quick_run) as `python -m pytest` does.
    options = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "." in options.get("pythonpath", [])
