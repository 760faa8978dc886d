"""The run's state, the objects that own it, and when they are due: `RunState` saved and restored
as one thing (`Checkpointer`), held-out evaluation (`Evaluator`), and what a step reports
(`StepReport`). Fakes stand in for the trainer and the rollout workers: no engine runs."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
import torch

from cadence.config import EvalConfig
from cadence.models.tiny import char_tokenizer, tiny_model
from cadence.observe.config import LoggingConfig
from cadence.observe.metrics import read_jsonl
from cadence.observe.reward_errors import RewardFunctionError
from cadence.observe.run_status import RunStatus
from cadence.observe.step_report import StepReport
from cadence.recipes.evaluator import Evaluator
from cadence.rollout.evaluate import EvalResult
from cadence.rollout.sample import Group, Sample
from cadence.train.checkpoint import list_checkpoints, load_state
from cadence.train.checkpointer import Checkpointer
from cadence.train.config import CheckpointConfig
from cadence.train.run_state import Counters, RunState

MODEL = tiny_model(hidden_size=32, layers=1, heads=2)


class FakeTrainer:
    def __init__(self, version: int = 0, sharded: bool = False) -> None:
        self.model, self.version, self.sharded = MODEL, version, sharded
        self.loaded: tuple | None = None
        self.saved_into: list[Path] = []

    def state_dict(self) -> dict:
        state = {"version": self.version, "kl_coef": 0.0625}
        return state if self.sharded else {**state, "optimizer": {"lr": 0.5}}

    def load_state_dict(self, state: dict, folder: Path | None = None) -> None:
        self.loaded, self.version = (state, folder), state["version"]

    def weights(self) -> dict:
        return {"w": torch.full((2,), float(self.version))}

    def save(self, folder: Path) -> None:
        self.saved_into.append(folder)

    def close(self) -> None:
        pass


class FakeWorkers:
    def __init__(self, cursor: int = 0) -> None:
        self.cursor, self.calls = cursor, []
        self.scored = {"calls": 0, "errors": 0, "timeouts": 0, "first_failures": {}}

    def state_dict(self) -> list[dict]:
        return [{"cursor": self.cursor}]

    def load_state_dict(self, states: list[dict], version: int) -> None:
        self.calls.append(("load", states, version))

    def update_weights(self, weights: dict, version: int) -> None:
        self.calls.append(("weights", float(weights["w"][0]), version))

    def evaluate(self, samples: int) -> EvalResult:
        self.calls.append(("evaluate", samples))
        return EvalResult(pass_at_1=0.25, pass_at_k=0.5, k=samples, mean_reward=0.25, prompts=8)

    def metrics(self) -> dict[str, float]:
        return {"rollout/reward_errors_total": float(self.scored["errors"])}

    def health(self) -> dict:
        return {"reward": self.scored}


def _checkpointer(run_dir: Path, every: int = 2, keep: int = 5, last: int = 5) -> Checkpointer:
    return Checkpointer(run_dir, CheckpointConfig(every=every, keep=keep), last, char_tokenizer(), "seed: 3\n")


def test_a_checkpoint_is_due_every_n_steps_and_after_the_last():
    assert [s for s in range(1, 8) if _checkpointer(Path("."), every=2, last=7).due(s)] == [2, 4, 6, 7]
    assert [s for s in range(1, 6) if _checkpointer(Path("."), every=0, last=5).due(s)] == [5]


def test_run_state_saves_and_restores_as_one_thing(tmp_path, capsys):
    checkpoints = _checkpointer(tmp_path)
    before = EvalResult(pass_at_1=0.125, pass_at_k=0.125, k=1, mean_reward=0.1, prompts=8)
    run = RunState(step=4, counters=Counters(samples=64, tokens=900), eval_before=before)
    torch.manual_seed(5)
    random.seed(5)
    folder = checkpoints.save(run, FakeTrainer(version=4), FakeWorkers(cursor=17))
    expected = (torch.rand(3), random.random())  # what the generators give right after the save

    saved = load_state(folder)
    assert set(saved) == {"step", "rng", "trainer", "workers", "counters", "eval_before"}  # the on-disk names
    assert saved["counters"] == {"samples": 64, "tokens": 900}
    assert (folder / "run_config.yaml").read_text() == "seed: 3\n"

    torch.manual_seed(99)
    random.seed(99)
    trainer, workers = FakeTrainer(), FakeWorkers()
    restored = checkpoints.restore(checkpoints.latest(), trainer, workers)
    assert f"resumed from step 4 ({tmp_path})" in capsys.readouterr().out
    assert (restored.step, restored.counters, restored.eval_before) == (4, Counters(64, 900), before)
    assert trainer.loaded == ({"version": 4, "kl_coef": 0.0625, "optimizer": {"lr": 0.5}}, folder)
    # The engines get the trainer's restored weights before the workers their cursors, at its version.
    assert workers.calls == [("weights", 4.0, 4), ("load", [{"cursor": 17}], 4)]
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]


def test_a_checkpoint_written_before_run_state_loads(tmp_path):
    """The dict earlier versions wrote, key for key, restores (no eval before training)."""
    checkpoints = _checkpointer(tmp_path)
    folder = checkpoints.save(RunState(step=2), FakeTrainer(version=2), FakeWorkers())
    old = {"step": 2, "rng": load_state(folder)["rng"], "trainer": {"version": 2}, "workers": [{"cursor": 8}],
           "counters": {"samples": 32, "tokens": 410}}
    torch.save(old, folder / "trainer_state.pt")
    restored = checkpoints.restore(folder, FakeTrainer(), FakeWorkers())
    assert (restored.step, restored.counters, restored.eval_before) == (2, Counters(32, 410), None)
    assert restored.workers == [{"cursor": 8}]


def test_the_trainer_saves_its_part_into_the_checkpoint_before_it_is_complete(tmp_path):
    """Whatever `state_dict` leaves out (a data-parallel trainer's shards) is the trainer's to write."""
    trainer = FakeTrainer(sharded=True)
    folder = _checkpointer(tmp_path).save(RunState(step=2), trainer, FakeWorkers())
    assert [f.name for f in trainer.saved_into] == ["step_2.tmp"] and folder.name == "step_2"  # before the rename


def test_checkpoints_rotate_and_resume_picks_the_latest(tmp_path, capsys):
    checkpoints = _checkpointer(tmp_path, keep=2)
    assert checkpoints.latest() is None
    assert "no checkpoint" in capsys.readouterr().out
    for step in (1, 2, 3):
        checkpoints.save(RunState(step=step), FakeTrainer(version=step), FakeWorkers())
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3]
    assert checkpoints.latest().name == "step_3"


def test_evaluator_is_due_every_n_steps_and_after_the_last():
    def due(every: int, after: bool) -> list[int]:
        ev = Evaluator(EvalConfig(every=every, after=after), 5, FakeWorkers(), "held-out pass@1")
        return [s for s in range(1, 6) if ev.due(s)]

    assert due(2, True) == [2, 4, 5]
    assert due(2, False) == [2, 4]
    assert due(0, True) == [5]
    assert due(3, False) == [3]


def test_evaluator_before_during_and_after(capsys):
    workers = FakeWorkers()
    began = time.perf_counter()
    ev = Evaluator(EvalConfig(every=2, samples=4), 4, workers, "held-out pass@1")
    assert ev.before().pass_at_1 == 0.25
    assert "held-out pass@1 before training: 0.250" in capsys.readouterr().out
    metrics = ev.run(2)
    assert metrics["eval/pass@1"] == 0.25 and metrics["eval/pass@4"] == 0.5 and metrics["time/eval"] >= 0
    assert ev.final is None  # not the last step
    ev.run(4)
    assert ev.after() is ev.final is not None and 0 < ev.seconds <= time.perf_counter() - began
    assert [c for c in workers.calls if c[0] == "evaluate"] == [("evaluate", 4)] * 3  # after() reused step 4's

    resumed_at_end = Evaluator(EvalConfig(before=False), 4, workers, "held-out pass@1")
    assert resumed_at_end.before() is None
    assert resumed_at_end.after() is not None and len(workers.calls) == 4  # evaluated now
    assert Evaluator(EvalConfig(after=False), 4, workers, "x").after() is None


def _group(rewards: list[float], lengths: list[int], errors: int = 0) -> Group:
    samples = [
        Sample("p", 0, [1], [2] * n, [0.0] * n, r, version=0, finish_reason="length" if n >= 4 else "stop",
               finish_version=1 if i == 0 else 0, reward_error="Timeout" if i < errors else None)
        for i, (r, n) in enumerate(zip(rewards, lengths, strict=True))
    ]
    return Group(0, "p", samples)


def _report(run_dir: Path, workers: FakeWorkers, run: RunState, last: int = 6) -> StepReport:
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = LoggingConfig(tensorboard=False, progress=False, run_dir=str(run_dir))
    return StepReport(run_dir, cfg, run, last, workers, RunStatus(run_dir), char_tokenizer(), 0, {})


def _step(report: StepReport, step: int, groups: list[Group], extra: dict | None = None) -> dict:
    report.waiting(step)
    report.batch(step, 0, groups)
    report.syncing(step)
    metrics = report.stepped(step, groups, {"train/loss": 0.5, **(extra or {})})
    report.log(step, metrics)
    return metrics


def test_step_report_measures_the_batch_and_counts_the_run(tmp_path):
    run = RunState(step=0, counters=Counters(samples=10, tokens=100))
    report = _report(tmp_path, FakeWorkers(), run)
    began = time.perf_counter()
    assert list(report.steps()) == [1, 2, 3, 4, 5, 6]
    metrics = _step(report, 1, [_group([1.0, 0.0], [2, 4]), _group([1.0, 1.0], [3, 3])])
    assert metrics["train/loss"] == 0.5
    assert metrics["reward/mean"] == 0.75 and metrics["reward/accuracy"] == 0.75
    assert metrics["reward/std"] == pytest.approx(0.5)
    assert metrics["response/length_mean"] == 3.0 and metrics["response/length_max"] == 4.0
    assert metrics["response/truncated_fraction"] == 0.25
    assert metrics["response/interrupted_fraction"] == 0.5  # the first sample of each group
    assert run.counters == Counters(samples=14, tokens=112) and metrics["progress/samples_total"] == 14.0
    assert metrics["perf/tokens_per_s"] == pytest.approx(12 * metrics["perf/samples_per_s"] / 4)
    assert metrics["time/step"] >= metrics["time/weight_sync"] >= 0 and "rollout/reward_errors_total" in metrics
    assert 0 <= metrics["time/trainer_idle"] <= metrics["time/step"]
    report.waiting(2)
    report.batch(2, 1, [_group([1.0], [2])])
    report.syncing(2)
    report.stepped(2, [_group([1.0], [2])], {})
    assert report.trace.status.step == 1  # what a Ctrl-C now reports: step 2's metrics are not written yet
    assert 0 <= report.close() <= time.perf_counter() - began
    logged = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in logged] == [1] and logged[0]["reward/mean"] == 0.75


def test_a_resumed_report_starts_after_its_step_and_logs_eval_before_only_at_the_start(tmp_path):
    before = EvalResult(pass_at_1=0.5, pass_at_k=0.5, k=1, mean_reward=0.5, prompts=8)
    fresh = _report(tmp_path / "a", FakeWorkers(), RunState(step=0, eval_before=before))
    fresh.steps()
    fresh.close()
    assert json.loads((tmp_path / "a" / "metrics.jsonl").read_text())["eval/pass@1"] == 0.5  # at step 0
    resumed = _report(tmp_path / "b", FakeWorkers(), RunState(step=4, eval_before=before))
    assert list(resumed.steps()) == [5, 6] and resumed.trace.status.step == 4
    resumed.close()
    assert (tmp_path / "b" / "metrics.jsonl").read_text() == ""


def test_reward_failures_are_reviewed_after_errors_and_early_evaluations(tmp_path):
    """A reward that fails on nearly every response stops the run in its first steps: after a step
    with reward errors, or after an early step that evaluated (evaluation scores with it too)."""
    workers = FakeWorkers()
    broken = {"calls": 16, "errors": 16, "timeouts": 0,
              "first_failures": {"ValueError": {"message": "boom", "prompt": "1+1", "response": "2"}}}
    report = _report(tmp_path, workers, RunState())
    report.steps()
    _step(report, 1, [_group([0.0, 0.0], [2, 2])])  # no errors in the batch, no evaluation: not reviewed
    workers.scored = broken
    _step(report, 2, [_group([0.0, 0.0], [2, 2])])
    with pytest.raises(RewardFunctionError, match="failed on 16 of 16"):
        _step(report, 3, [_group([0.0, 0.0], [2, 2])], {"eval/pass@1": 0.0})
    late = _report(tmp_path / "late", workers, RunState(step=3))
    late.steps()
    _step(late, 4, [_group([0.0, 0.0], [2, 2])], {"eval/pass@1": 0.0})  # past CHECK_STEPS: not reviewed
    assert not (tmp_path / "late" / "reward_errors.log").exists()
    with pytest.raises(RewardFunctionError):
        _step(_report(tmp_path / "c", workers, RunState()), 1, [_group([0.0, 0.0], [2, 2], errors=1)])
    assert "ValueError" in (tmp_path / "reward_errors.log").read_text()


def test_evaluation_before_training_is_reviewed_at_step_0(tmp_path):
    workers = FakeWorkers()
    workers.scored = {"calls": 8, "errors": 8, "timeouts": 0, "first_failures": {}}
    before = EvalResult(pass_at_1=0.0, pass_at_k=0.0, k=1, mean_reward=0.0, prompts=8)
    with pytest.raises(RewardFunctionError, match="before training"):
        _report(tmp_path, workers, RunState(eval_before=before))
    _report(tmp_path / "resumed", workers, RunState(step=2, eval_before=before))  # reviewed when it ran
