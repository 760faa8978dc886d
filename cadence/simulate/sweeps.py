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
from cadence.simulate.cluster import SimResult, layout
from cadence.simulate.config import SimConfig
from cadence.simulate.sim import simulate

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


# -- agentic runs (cfg.env set) -------------------------------------------------------------

def lockstep(cfg: SimConfig) -> SimConfig:
    """The synchronous agentic baseline: lock-step turns, colocated, alpha = 0, no redundancy."""
    return variant(synchronous(cfg), {"env.mode": "lockstep", "env.redundancy": 0, "env.extra_groups": 0})


def agentic(cfg: SimConfig, redundancy: int = 2, extra_groups: int = 1, alpha_: int = 2,
            train_gpus: list[int] | None = None, progress: Progress = _quiet) -> list[dict]:
    """The agentic techniques one on top of the other, each against lock-step sync:
    env-level async (colocated, alpha 0), + redundant environments (`redundancy` episodes and
    `extra_groups` groups more), + asynchronous training (alpha; on the best of `train_gpus`
    training GPUs, or beta*'s split when None: beta* knows no environment time, so for
    episodes a small search is the better guide)."""
    sync = synchronous(cfg)
    spare = {"env.mode": "async", "env.redundancy": redundancy, "env.extra_groups": extra_groups}
    steps = [
        ("lock-step sync", lockstep(cfg)),
        ("env-level async", variant(sync, {"env.mode": "async", "env.redundancy": 0, "env.extra_groups": 0})),
        (f"+ redundancy ({redundancy} episodes, {extra_groups} group)", variant(sync, spare)),
    ]
    rows: list[dict] = []
    for name, c in steps:
        rows.append(_agentic_row(name, simulate(c), progress))
    separate = variant(cfg, {**spare, "cluster.colocate": False, "cluster.alpha": alpha_})
    tried = [_agentic_row(f"+ async training (alpha {alpha_})", simulate(variant(separate, {"cluster.train_gpus": t})),
                          progress) for t in (train_gpus or [layout(separate).train_gpus])]
    best = max(tried, key=lambda row: row["samples_per_s"])
    best["splits_tried"] = [{"train_gpus": r["train_gpus"], "samples_per_s": r["samples_per_s"]} for r in tried]
    rows.append(best)
    for before, row in zip([None, *rows], rows, strict=False):
        row["x_lockstep"] = row["samples_per_s"] / rows[0]["samples_per_s"]
        row["x_previous"] = row["samples_per_s"] / before["samples_per_s"] if before else 1.0
    return rows


def _agentic_row(name: str, r: SimResult, progress: Progress) -> dict:
    progress(f"{name}, {r.train_gpus} train GPUs: {r.step_s:.0f} s a step, {r.samples_per_s:.3f} episodes/s")
    return {"setting": name, "train_gpus": r.train_gpus, "step_s": r.step_s, "samples_per_s": r.samples_per_s,
            "engine_busy": r.engine_busy_fraction, "staleness": _staleness(r),
            "episodes_cancelled": r.counts.get("cancelled", 0), "cpu_s": r.cpu_s}


def env_latency(cfg: SimConfig, means: list[float], progress: Progress = _quiet) -> list[dict]:
    """Lock-step against env-level async (both synchronous training) as environment steps slow
    down: latency N(mean, mean), clipped at 0."""
    rows = []
    for m in means:
        c = variant(cfg, {"env.latency.mean_s": m, "env.latency.std_s": m})
        lock, asy = simulate(lockstep(c)), simulate(variant(synchronous(c), {"env.mode": "async"}))
        progress(f"latency {m:g} s: lock-step {lock.step_s:.0f} s, async {asy.step_s:.0f} s a step")
        rows.append({"latency_s": m, "lockstep_step_s": lock.step_s, "async_step_s": asy.step_s,
                     "async_over_lockstep": asy.samples_per_s / lock.samples_per_s})
    return rows
