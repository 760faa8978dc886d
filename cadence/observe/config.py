"""`LoggingConfig`: where a run writes its metrics, timeline and samples, and who is told."""

from __future__ import annotations

import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


def timestamp_name() -> str:
    """Now, as a run name that sorts by time (as Hydra names its runs)."""
    return datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


class LoggingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    run_dir: str = Field("runs/{name}", description="Output folder; {name} is replaced by `name`.")
    name: str = Field(
        default_factory=timestamp_name, description="Run name; default: the start time, so each run gets "
        "a new folder (`cadence train --resume` without a name continues the latest run)."
    )
    tensorboard: bool = Field(True, description="Write TensorBoard events.")
    wandb: bool = Field(False, description="Log to Weights & Biases (needs `wandb`).")
    mlflow: bool = Field(False, description="Log to MLflow (needs `mlflow`).")
    progress: bool = Field(True, description="Show a progress bar.")
    events: bool = Field(
        True, description="Write the pipeline timeline (<run>/events/*.jsonl: spans of generating, waiting, "
        "training, weight sync per actor; staleness per step) for `cadence dashboard`."
    )
    samples_every: int = Field(
        1, ge=0, description="Log the trained samples of every N-th step to <run>/samples.jsonl (tokens, "
        "loss mask, reward, versions) for `cadence dashboard`; 0 = off."
    )
    samples_groups: int = Field(1, gt=0, description="Groups logged per logged step (samples_every).")
    samples_max: int = Field(
        5000, gt=0, description="samples.jsonl rotates to samples.1.jsonl past this many lines (bounded on disk)."
    )
    dashboard: bool = Field(False, description="Start `cadence dashboard` beside the run and print its address.")
    dashboard_port: int = Field(8484, ge=0, le=65535, description="Port of logging.dashboard (0 = any free port).")
    webhook_url: str | None = Field(
        None, description="POST a JSON message here when a supervised run fails, restarts or finishes "
        "(runtime.max_restarts > 0); None = no messages."
    )

    def resolved_run_dir(self) -> Path:
        """This run's folder: `run_dir` with `{name}` filled in."""
        return Path(self.run_dir.format(name=self.name))
