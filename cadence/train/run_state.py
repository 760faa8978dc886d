"""Where a run stands between two steps: everything `--resume` continues from besides the weights.

One object, saved as one file in each checkpoint (`trainer_state.pt`, a dict
of these fields under the names checkpoints have always used, so older
checkpoints load):

  step         the last step finished
  counters     samples and tokens trained on so far
  eval_before  the held-out evaluation before training (the summary compares with it)
  trainer      the trainer's state: version, optimizer, LR schedule, adaptive-KL
               coefficient, critics (`Trainer.state_dict`)
  workers      each rollout worker's: producer keys or prompt cursor, engine sampling RNG
  rng          this process's torch, python, numpy (and CUDA) generators

The loop keeps `step`, `counters` and `eval_before` current; `capture` takes the
rest from their owners just before a save, `restore` gives it back to them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cadence.rollout.evaluate import EvalResult
from cadence.train.checkpoint import rng_state, set_rng_state
from cadence.train.protocol import Trainer


class RolloutState(Protocol):
    """The rollout side's resume state (a `WorkerGroup`)."""

    def state_dict(self) -> list[dict]: ...

    def load_state_dict(self, states: list[dict], version: int) -> None: ...

    def update_weights(self, state_dict: dict, version: int) -> None: ...


@dataclass
class Counters:
    samples: int = 0
    tokens: int = 0


@dataclass
class RunState:
    step: int = 0
    counters: Counters = field(default_factory=Counters)
    eval_before: EvalResult | None = None
    trainer: dict[str, Any] = field(default_factory=dict)
    workers: list[dict] = field(default_factory=list)
    rng: dict[str, Any] = field(default_factory=dict)

    def capture(self, trainer: Trainer, workers: RolloutState) -> None:
        """Take the trainer's, the rollout workers' and this process's RNG state, to save."""
        self.trainer, self.workers, self.rng = trainer.state_dict(), workers.state_dict(), rng_state()

    def restore(self, trainer: Trainer, workers: RolloutState, folder: Path) -> None:
        """Give them back: the trainer (its shards read from `folder`), this process's RNG, then
        the engines the trainer's weights and the workers their cursors, at the trainer's version."""
        trainer.load_state_dict(self.trainer, folder)
        set_rng_state(self.rng)
        workers.update_weights(trainer.weights(), trainer.version)  # on CPU whatever trainer.device
        workers.load_state_dict(self.workers, trainer.version)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step, "rng": self.rng, "trainer": self.trainer, "workers": self.workers,
            "counters": asdict(self.counters), "eval_before": self.eval_before,
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> RunState:
        return cls(
            step=int(state["step"]), counters=Counters(**state["counters"]), eval_before=state.get("eval_before"),
            trainer=state["trainer"], workers=state["workers"], rng=state["rng"],
        )
