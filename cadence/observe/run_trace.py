"""What the training loop leaves for `cadence dashboard`: the trainer's timeline, the
staleness of every trained batch, a bounded sample log and the status heartbeat.

The recipe calls one method per phase of a step; each is a few comparisons
and, on a logged step, one JSON line per sample (measured in docs/dashboard.md).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from cadence.observe.config import LoggingConfig
from cadence.observe.events import EVENTS_DIR, Timeline, cut_back
from cadence.observe.run_status import RunStatus
from cadence.observe.sample_log import SampleLog
from cadence.rollout.sample import Group


class RunTrace:
    def __init__(
        self, run_dir: Path, cfg: LoggingConfig, tokenizer: Any, alpha: int, status: RunStatus, resume_step: int = 0
    ) -> None:
        """`resume_step`: the checkpoint a resumed run starts from; what a killed run logged after it goes."""
        cut_back(run_dir / EVENTS_DIR / "trainer.jsonl", resume_step)
        self.timeline = Timeline(run_dir if cfg.events else None, "trainer")
        self.samples = SampleLog(run_dir, tokenizer, cfg.samples_every, cfg.samples_groups, cfg.samples_max, resume_step)
        self.alpha = alpha
        self.status = status

    def waiting(self, step: int) -> None:
        """The trainer asks rollout for a batch."""
        self.timeline.enter("waiting", step)

    def batch(self, step: int, trainer_version: int, groups: list[Group]) -> None:
        """The batch arrived (the trainer is still at `trainer_version`); training starts."""
        counts = Counter(trainer_version - s.version for g in groups for s in g.samples)
        self.timeline.record(kind="staleness", step=step, alpha=self.alpha,
                             counts={str(k): v for k, v in sorted(counts.items())})
        self.samples.log(step, trainer_version, groups)
        self.timeline.enter("training", step)

    def syncing(self, step: int) -> None:
        self.timeline.enter("weight_sync", step)

    def phase(self, name: str, step: int) -> None:
        """Anything else the loop does (evaluating, checkpointing, logging)."""
        self.timeline.enter(name, step)
        if name == "checkpointing":
            self.timeline.flush()

    def stepped(self, step: int) -> None:
        """Trained and synced: the step's metrics come next."""
        self.timeline.enter("logging", step)

    def logged(self, step: int) -> None:
        """The step's metrics are written: the heartbeat names it as the last step (what a
        Ctrl-C reports)."""
        self.status.beat(step)

    def close(self) -> None:
        self.timeline.close()
        self.samples.close()
