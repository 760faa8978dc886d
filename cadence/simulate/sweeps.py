"""The questions a user sizing a cluster asks, each a sweep of simulated runs.

- `compare`: synchronous (colocated, ROLL's baseline) against asynchronous on one budget.
- `scaling`: both from a few GPUs to many, the batch growing with the GPUs.
- `split`: one budget, cut differently between generation and training (beta*).
- `alpha`: one split, different asynchronous ratios.
- `tail`: responses more or less long-tailed (sigma), sync against async.

Each returns rows (dicts) that `format_table` prints and the benchmark saves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cadence.config import apply_override
from cadence.simulate.cluster import SimResult, layout, simulate
from cadence.simulate.config import SimConfig

Progress = Callable[[str], None]


def variant(cfg: SimConfig, changes: dict[str, Any]) -> SimConfig:
    """`cfg` with dotted-key changes, validated again."""
    tree = cfg.model_dump()
    for key, value in changes.items():
        apply_override(tree, key.split("."), value)
    return SimConfig.model_validate(tree)


def synchronous(cfg: SimConfig) -> SimConfig:
    """The same run, generation and training taking turns on every GPU (alpha = 0)."""
    return variant(cfg, {"cluster.alpha": 0, "cluster.colocate": True, "cluster.train_gpus": None})


def _quiet(_: str) -> None:
    pass


def compare(cfg: SimConfig, progress: Progress = _quiet) -> dict:
    """Sync (colocated) and async throughput on `cfg`'s budget and workload."""
    sync = simulate(synchronous(cfg))
    progress(f"sync {cfg.cluster.gpus} GPUs: {sync.samples_per_s:.2f} samples/s")
    asy = simulate(cfg)
    progress(f"async {cfg.cluster.gpus} GPUs ({asy.train_gpus} train): {asy.samples_per_s:.2f} samples/s")
    return {
        "gpus": cfg.cluster.gpus,
        "prompts_per_step": cfg.workload.prompts_per_step,
        "train_gpus": asy.train_gpus,
        "sync_samples_per_s": sync.samples_per_s,
        "async_samples_per_s": asy.samples_per_s,
        "async_over_sync": asy.samples_per_s / sync.samples_per_s,
        "sync_step_s": sync.step_s,
        "async_step_s": asy.step_s,
        "async_staleness": _staleness(asy),
        "sync_engine_busy": sync.engine_busy_fraction,
        "async_engine_busy": asy.engine_busy_fraction,
        "sync_cpu_s": sync.cpu_s,
        "async_cpu_s": asy.cpu_s,
    }


def scaling(cfg: SimConfig, gpus: list[int], progress: Progress = _quiet) -> list[dict]:
    """`compare` at each GPU count, prompts per step in proportion to GPUs (cfg's ratio)."""
    per_gpu = cfg.workload.prompts_per_step / cfg.cluster.gpus
    rows = []
    for g in gpus:
        prompts = max(1, round(per_gpu * g))
        rows.append(compare(variant(cfg, {"cluster.gpus": g, "workload.prompts_per_step": prompts}), progress))
    first = rows[0]
    for row in rows:
        row["sync_scale"] = row["sync_samples_per_s"] / first["sync_samples_per_s"]
        row["async_scale"] = row["async_samples_per_s"] / first["async_samples_per_s"]
    return rows


def split(cfg: SimConfig, train_gpus: list[int], progress: Progress = _quiet) -> list[dict]:
    """Async throughput for each number of training GPUs out of `cfg.cluster.gpus`."""
    suggested = layout(variant(cfg, {"cluster.train_gpus": None})).train_gpus
    rows = []
    for t in train_gpus:
        r = simulate(variant(cfg, {"cluster.train_gpus": t}))
        progress(f"split {r.rollout_gpus} rollout / {t} train: {r.samples_per_s:.2f} samples/s")
        rows.append({"train_gpus": t, "rollout_gpus": r.rollout_gpus, "samples_per_s": r.samples_per_s,
                     "step_s": r.step_s, "engine_busy": r.engine_busy_fraction, "beta_star_train_gpus": suggested})
    worst = min(row["samples_per_s"] for row in rows)
    for row in rows:
        row["x_worst"] = row["samples_per_s"] / worst
    return rows


def alpha(cfg: SimConfig, alphas: list[int], progress: Progress = _quiet) -> list[dict]:
    """Async throughput for each alpha on one split (cfg's, or beta*'s at cfg's alpha)."""
    train = layout(cfg).train_gpus
    sync = simulate(synchronous(cfg))
    rows = []
    for a in alphas:
        r = simulate(variant(cfg, {"cluster.alpha": a, "cluster.train_gpus": train}))
        progress(f"alpha {a}: {r.samples_per_s:.2f} samples/s")
        rows.append({"alpha": a, "train_gpus": train, "samples_per_s": r.samples_per_s, "step_s": r.step_s,
                     "x_sync": r.samples_per_s / sync.samples_per_s, "staleness": _staleness(r)})
    best = max(row["samples_per_s"] for row in rows)
    for row in rows:
        row["of_best"] = row["samples_per_s"] / best
    return rows


def tail(cfg: SimConfig, sigmas: list[float], progress: Progress = _quiet) -> list[dict]:
    """`compare` for each lognormal sigma (0: every response the median length)."""
    rows = []
    for s in sigmas:
        row = compare(variant(cfg, {"workload.sigma": s}), progress)
        rows.append({"sigma": s, **row})
    return rows


def _staleness(result: SimResult) -> float:
    measured = result.steps[result.warmup_steps:]
    return sum(s.staleness_mean for s in measured) / len(measured)


def format_table(rows: list[dict], columns: list[str]) -> str:
    """A markdown table of `columns` (floats to 3 significant digits)."""
    def cell(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)
