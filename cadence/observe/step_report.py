"""What each training step leaves behind: its metrics, the run's warnings, what the dashboard reads.

The training loop tells `StepReport` each phase of a step (`waiting`, `batch`,
`syncing`, `stepped`, `log`); it owns everything that only watches the run:

  batch metrics  rewards, response lengths, truncated and interrupted fractions, the
                 step's timing and throughput, and the run's totals (`RunState.counters`)
  warnings       equal rewards in every group of the first steps (`FlatRewardWatch`);
                 reward-function failures (`RewardErrorReport`), reviewed after the
                 evaluation before training, after a step with reward errors, and after
                 each of the first CHECK_STEPS steps that evaluated
  sinks          metrics.jsonl and the trackers chosen (`MetricsLogger`), the dashboard's
                 timeline, sample log and heartbeat (`RunTrace`), the progress bar
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import torch

from cadence.observe.config import LoggingConfig
from cadence.observe.flat_rewards import FlatRewardWatch
from cadence.observe.metrics import MetricsLogger
from cadence.observe.progress import TrainingBar
from cadence.observe.reward_errors import CHECK_STEPS, RewardErrorReport
from cadence.observe.run_status import RunStatus
from cadence.observe.run_trace import RunTrace
from cadence.rollout.producer import reward_health
from cadence.rollout.sample import Group, Sample
from cadence.train.run_state import RunState


class RolloutReports(Protocol):
    """What the rollout side reports (a `WorkerGroup`)."""

    def metrics(self) -> dict[str, float]: ...

    def health(self) -> dict[str, Any]: ...


def batch_metrics(samples: list[Sample]) -> dict[str, float]:
    """Rewards and responses of one trained batch."""
    rewards = torch.tensor([s.reward for s in samples])
    lengths = torch.tensor([len(s.response_ids) for s in samples], dtype=torch.float32)
    return {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        "reward/accuracy": float((rewards >= 1.0).float().mean()),
        "reward/errors": float(sum(s.reward_error is not None for s in samples)),
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/truncated_fraction": sum(s.finish_reason == "length" for s in samples) / len(samples),
        # Responses whose tokens came from more than one policy version (interruptible generation).
        "response/interrupted_fraction": sum(
            s.finish_version is not None and s.finish_version != s.version for s in samples
        ) / len(samples),
    }


class StepReport:
    def __init__(
        self, run_dir: Path, cfg: LoggingConfig, run: RunState, last_step: int, workers: RolloutReports,
        status: RunStatus, tokenizer: Any, alpha: int, config: dict[str, Any],
    ) -> None:
        """`run`: where the run starts (a resumed run's files are cut back to its step); `config`:
        the run's config for the trackers; `alpha`: the async ratio (the dashboard's staleness)."""
        self.run, self.last_step, self.workers = run, last_step, workers
        self.reward_errors = RewardErrorReport(run_dir)
        if run.step == 0 and run.eval_before is not None:
            self.reward_errors.review(reward_health(workers.health()), 0)  # evaluation scores with the same reward
        self.logger = MetricsLogger(run_dir, config, resume_step=run.step, tensorboard=cfg.tensorboard,
                                    wandb=cfg.wandb, mlflow=cfg.mlflow, name=cfg.name)
        if run.step == 0 and run.eval_before is not None:
            self.logger.log(0, run.eval_before.as_metrics())  # step 0: the policy before any update
        status.beat(run.step)  # the last step logged, until the next is
        self.trace = RunTrace(run_dir, cfg, tokenizer, alpha, status, run.step)
        self.flat_rewards = FlatRewardWatch()  # warns if the first steps' groups all have equal rewards
        self.progress = cfg.progress
        self.began = self.started = self.waited = self.synced = 0.0

    def steps(self) -> Iterable[int]:
        """The steps left to train, on the progress bar (its ETA leaves out the first step's warm-up)."""
        self.bar = TrainingBar(range(self.run.step + 1, self.last_step + 1), initial=self.run.step,
                               total=self.last_step, desc="train", disable=not self.progress, dynamic_ncols=True)
        self.began = time.perf_counter()
        return self.bar

    def waiting(self, step: int) -> None:
        """The trainer asks rollout for a batch."""
        self.started = time.perf_counter()
        self.trace.waiting(step)

    def batch(self, step: int, version: int, groups: list[Group]) -> None:
        """The batch arrived (the trainer still at `version`); training starts."""
        self.waited = time.perf_counter() - self.started
        self.trace.batch(step, version, groups)

    def syncing(self, step: int) -> None:
        """Trained; the new weights go to the engines."""
        self.trace.syncing(step)
        self.synced = time.perf_counter()

    def stepped(self, step: int, groups: list[Group], metrics: dict[str, float]) -> dict[str, float]:
        """The step is done: the trainer's `metrics` with the batch's, the step's timing and rollout's."""
        now = time.perf_counter()
        sync_seconds, seconds = now - self.synced, now - self.started
        self.trace.stepped(step)
        self.flat_rewards.update(groups)
        samples = [s for g in groups for s in g.samples]
        tokens = sum(len(s.response_ids) for s in samples)
        self.run.counters.samples += len(samples)
        self.run.counters.tokens += tokens
        metrics.update(batch_metrics(samples))
        metrics.update({
            "time/step": seconds,
            "time/trainer_idle": self.waited,
            "time/weight_sync": sync_seconds,
            "perf/weight_sync_s": sync_seconds,
            "perf/samples_per_s": len(samples) / seconds,
            "perf/tokens_per_s": tokens / seconds,
            "progress/samples_total": float(self.run.counters.samples),
            **self.workers.metrics(),
        })
        return metrics

    def phase(self, name: str, step: int) -> None:
        """Anything else the loop does at `step` (evaluating, checkpointing)."""
        self.trace.phase(name, step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Review reward failures when due, write the step's metrics, update the bar."""
        if metrics["reward/errors"] or (step <= CHECK_STEPS and "eval/pass@1" in metrics):
            self.reward_errors.review(reward_health(self.workers.health()), step)
        self.logger.log(step, metrics)
        self.trace.logged(step)
        self.bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", acc=f"{metrics['reward/accuracy']:.2f}")

    def close(self) -> float:
        """The seconds since the first step began."""
        self.bar.close()
        self.trace.close()
        self.logger.close()
        return time.perf_counter() - self.began
