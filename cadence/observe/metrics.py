"""Metric sinks: metrics.jsonl and TensorBoard by default, W&B or MLflow on request.

`metrics.jsonl` holds one JSON object per training step. On resume it is cut
back to the checkpoint's step first, so a killed run leaves no gaps and no
duplicated steps.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def truncate_jsonl(path: Path, last_step: int, keep: Callable[[dict], bool] | None = None) -> None:
    """Keep only records with step <= last_step, or that `keep` accepts (and drop a torn last line)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
        if record.get("step", 0) <= last_step or (keep is not None and keep(record)):
            kept.append(line)
    path.write_text("".join(k + "\n" for k in kept))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSONL log so far: whole lines only, so a log its writer is still
    appending to reads without a half-written last record."""
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line.strip()]


class MetricsLogger:
    def __init__(
        self,
        run_dir: Path,
        config: dict,
        resume_step: int = 0,
        tensorboard: bool = True,
        wandb: bool = False,
        mlflow: bool = False,
        name: str = "cadence",
    ) -> None:
        self.path = run_dir / "metrics.jsonl"
        truncate_jsonl(self.path, resume_step)
        self._file = self.path.open("a")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step drops events a killed run wrote after its last checkpoint.
            self._tb = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_step + 1)
        self._wandb = None
        if wandb:
            try:
                import wandb as wandb_module
            except ImportError as err:
                raise RuntimeError("logging.wandb=true needs `pip install wandb`") from err
            self._wandb = wandb_module.init(project="cadence", name=name, config=config, resume="allow")
        self._mlflow = None
        if mlflow:
            try:
                import mlflow as mlflow_module
            except ImportError as err:
                raise RuntimeError("logging.mlflow=true needs `pip install mlflow`") from err
            self._mlflow = mlflow_module
            mlflow_module.start_run(run_name=name)
            mlflow_module.log_params({k: str(v) for k, v in _flat(config).items()})

    def log(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, int | float):
                    self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)
        if self._mlflow is not None:
            self._mlflow.log_metrics({k.replace("/", "."): v for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._mlflow is not None:
            self._mlflow.end_run()


def _plain(v: Any) -> Any:
    return float(v) if hasattr(v, "item") else v


def _flat(tree: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
