"""When a run saves a checkpoint, what goes in it, and where a resumed run starts from.

A checkpoint is the policy's Hugging Face weights, the tokenizer, the config it
was trained under, and the `RunState` (`cadence.train.checkpoint` has the layout).
One is due every `checkpoint.every` steps and after the last; `checkpoint.keep`
are kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cadence.train.checkpoint import latest_checkpoint, load_state, save_checkpoint
from cadence.train.config import CheckpointConfig
from cadence.train.protocol import Trainer
from cadence.train.resume import CONFIG_FILE
from cadence.train.run_state import RolloutState, RunState


class Checkpointer:
    def __init__(self, run_dir: Path, cfg: CheckpointConfig, last_step: int, tokenizer: Any, config_text: str) -> None:
        """`config_text`: the run's config as YAML, saved in each checkpoint (what `--resume` checks)."""
        self.run_dir, self.cfg, self.last_step = run_dir, cfg, last_step
        self.tokenizer, self.config_text = tokenizer, config_text

    def due(self, step: int) -> bool:
        return bool(self.cfg.every and step % self.cfg.every == 0) or step == self.last_step

    def save(self, run: RunState, trainer: Trainer, workers: RolloutState) -> Path:
        """`step_<run.step>`: the trainer's weights and the run's state, taken now."""
        run.capture(trainer, workers)
        return save_checkpoint(
            self.run_dir, run.step, trainer.model, self.tokenizer, run.to_dict(), keep=self.cfg.keep,
            files={CONFIG_FILE: self.config_text}, save_trainer=trainer.save,
        )

    def latest(self) -> Path | None:
        """The checkpoint a resumed run starts from (None, said aloud, when there is none)."""
        found = latest_checkpoint(self.run_dir)
        if found is None:
            print(f"--resume: no checkpoint in {self.run_dir}; starting from scratch")
            return None
        return found[1]

    def restore(self, folder: Path, trainer: Trainer, workers: RolloutState) -> RunState:
        """The run as saved in `folder`, its state given back to the trainer and the workers (the
        trainer was built from the folder's weights)."""
        run = RunState.from_dict(load_state(folder))
        run.restore(trainer, workers, folder)
        print(f"resumed from step {run.step} ({self.run_dir})")
        return run
