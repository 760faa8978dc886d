"""What the benchmarks share: train one config in this process and read its metrics; name the CPU."""

from __future__ import annotations

import contextlib
import platform
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Overrides for a run that is only timed: no held-out evaluations, progress bars,
# TensorBoard files or checkpoints inside the steps being measured.
TIMING_ONLY = [
    "eval.before=false",
    "eval.after=false",
    "eval.every=0",
    "logging.progress=false",
    "logging.tensorboard=false",
    "checkpoint.every=0",
]


@dataclass
class TrainedRun:
    """One `cadence train` run: its config, summary, per-step metrics and clocks."""

    cfg: Any  # cadence.config.RunConfig
    summary: Any  # cadence.recipes.train_rlvr.RunSummary
    records: list[dict[str, Any]]  # metrics.jsonl, one dict per training step
    wall_s: float  # train() in this process, start-up and evaluations included
    began: float  # time.time() when train() was called
    ended: float  # time.time() when it returned


def train_run(overrides: list[str], run_dir: str | None = None) -> TrainedRun:
    """Train with `overrides` and read the metrics; Ray, when the run started it, is shut down after.

    Without `run_dir` the run writes to a temporary folder, removed once its
    metrics are read (so `summary.run_dir` no longer exists afterwards).
    """
    from cadence.config import load_config
    from cadence.observe.metrics import read_jsonl
    from cadence.recipes.train_rlvr import train

    with contextlib.ExitStack() as stack:
        where = run_dir or stack.enter_context(tempfile.TemporaryDirectory())
        cfg = load_config(None, [*overrides, f"logging.run_dir={where}"])
        began, t0 = time.time(), time.perf_counter()
        summary = train(cfg)
        wall_s, ended = time.perf_counter() - t0, time.time()
        # Training steps only: step 0 holds the held-out evaluation before training.
        records = [r for r in read_jsonl(summary.run_dir / "metrics.jsonl") if "time/step" in r]
    if cfg.runtime.kind == "ray":
        import ray

        ray.shutdown()
    return TrainedRun(cfg, summary, records, wall_s, began, ended)


@dataclass
class ExampleRun:
    """`cadence train --config <example>` run as a user runs it, in a child process."""

    command: str  # what a user types to reproduce it
    run_dir: Path
    records: list[dict[str, Any]]  # metrics.jsonl, step 0 (the evaluation before training) included
    wall_s: float
    loadavg_before: tuple[float, float, float]
    loadavg_after: tuple[float, float, float]

    def where_and_when(self) -> dict[str, Any]:
        """The result fields that say on what machine, under what load and when it was measured."""
        import os

        return {
            "loadavg_before": [round(x, 2) for x in self.loadavg_before],
            "loadavg_after": [round(x, 2) for x in self.loadavg_after],
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, shared with other jobs (see loadavg)",
            "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }


def run_example(config: str, overrides: list[str], name: str) -> ExampleRun:
    """Run `cadence train --config config [overrides]` from the checkout's root into
    runs/<name>-<time>, and read its metrics; the load average is kept because the machine
    may be shared."""
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    run_dir = root / "runs" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    command = ["cadence", "train", "--config", config, *overrides]
    load_before, began = os.getloadavg(), time.perf_counter()
    subprocess.run([sys.executable, "-m", "cadence", *command[1:], "logging.progress=false",
                    f"logging.run_dir={run_dir}"], cwd=root, check=True)
    wall_s, load_after = time.perf_counter() - began, os.getloadavg()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return ExampleRun(" ".join(command), run_dir, records, wall_s, load_before, load_after)


def timed_steps(records: list[dict[str, Any]], warmup: int) -> tuple[list[dict[str, Any]], float, float]:
    """The steps after the first `warmup`, their seconds, and the samples trained in them."""
    timed = records[warmup:]
    seconds = sum(r["time/step"] for r in timed)
    before = records[warmup - 1]["progress/samples_total"] if warmup else 0.0
    samples = timed[-1]["progress/samples_total"] - before
    return timed, seconds, samples


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, or what `platform` knows elsewhere."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return model


def plot_curve(points: list[dict[str, Any]], path: Path, title: str, label: str, ylabel: str = "success rate",
               baseline: tuple[float, str] | None = None) -> None:
    """Held-out success (`curve()`'s points) against training minutes, with an optional
    horizontal `baseline` (value, label), into a PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot([p["train_seconds"] / 60 for p in points], [p["held_out_success"] for p in points], "o-", label=label)
    if baseline is not None:
        ax.axhline(baseline[0], color="grey", linestyle=":", label=baseline[1])
    ax.set(xlabel="training minutes", ylabel=ylabel, ylim=(0, 1), title=title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
