"""Synchronous vs asynchronous RLVR throughput under long-tailed response lengths.

    python benchmarks/async_throughput.py            # full table (~5 min on 2 cores)
    python benchmarks/async_throughput.py --quick    # smoke run

Same model (the built-in one), task, batch (16 prompts x 8 answers) and the
machine's 2 cores for every variant, run one after another in this process:

  sync (inline)   one process, both cores, alpha = 0
  sync (ray)      rollout worker on one core, trainer on the other, alpha = 0
  async alpha=k   the same split, rollout up to k policy versions ahead
  async alpha=2, batch-wise generation / no prompt replication
                  the same, with one rollout technique switched off

Response lengths are forced to a log-normal long tail (median 24 tokens,
sigma 1.0, so the longest of a batch is ~10-15x the median) with
`rollout.simulate_lengths`, a benchmark mode of the real embedded engine.
A second table times generating one training batch (16 prompts x 8 answers,
32 engine slots) through the rollout path three ways: batch-wise (a new wave
only when the whole last wave is done, a prompt's answers admitted
together), queue scheduling (freed slots take new work at once) and queue
scheduling with prompt replication (each answer its own request). It does so
on the embedded engine (CPU: a step costs more with more rows) and on the
mock engine with a GPU-like decode cost (a step costs about the same
whatever the rows), the regime ROLL Flash measured.

The run also prints beta*, the training share ROLL Flash's bound suggests
from the synchronous run's measured times (cadence/runtime/split.py).

Results go to docs/results/async_throughput.json and the table in
docs/async.md between its markers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from cadence.config import load_config
from cadence.inference.embedded import EmbeddedEngine
from cadence.inference.mock import MockEngine
from cadence.inference.types import SamplingParams
from cadence.models.loading import load_policy, load_tokenizer
from cadence.observe.report import write_doc_table
from cadence.rewards.guard import RewardOutcome
from cadence.rollout.prompts import PromptStream
from cadence.runtime.split import beta_star, measured_split

# The shared benchmark harness lives beside this script (benchmarks/ is not a package).
sys.path.insert(0, str(Path(__file__).resolve().parent))
import async_timeline  # noqa: E402
from harness import TIMING_ONLY, timed_steps, train_run  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "async.md"
RESULTS = ROOT / "docs" / "results" / "async_throughput.json"
LONG_TAIL = [
    "rollout.simulate_lengths.median_tokens=24",
    "rollout.simulate_lengths.sigma=1.0",
    "rollout.simulate_lengths.max_tokens=400",
]
COMMON = [
    "rollout.prompts_per_step=16",
    "rollout.group_size=8",
    "rollout.engine.max_batch_size=64",
    "trainer.micro_batch_size=32",
    *TIMING_ONLY,
]
# Start-up is not timed: on a busy machine a Ray actor can take over the default minute to start.
RAY = ["runtime.kind=ray", "runtime.threads=1", "runtime.placement_timeout_s=900"]
VARIANTS = {
    "sync (inline, 2 threads)": ["runtime.kind=inline", "runtime.threads=2", "rollout.async_ratio=0"],
    "sync (ray, 1+1 cores)": [*RAY, "rollout.async_ratio=0"],
    "async alpha=1": [*RAY, "rollout.async_ratio=1"],
    "async alpha=2": [*RAY, "rollout.async_ratio=2"],
    "async alpha=4": [*RAY, "rollout.async_ratio=4"],
    "async alpha=2, batch-wise generation": [*RAY, "rollout.async_ratio=2", "rollout.engine.static_batching=true"],
    "async alpha=2, no prompt replication": [*RAY, "rollout.async_ratio=2", "rollout.replicate_prompts=false"],
}
SYNC = ("sync (inline, 2 threads)", "sync (ray, 1+1 cores)")


def cadence_imported() -> str:
    """Where this process's `cadence` comes from (compare_commits.py runs two trees)."""
    import cadence

    return str(Path(cadence.__file__).parent)


def ray_worker_cadence(overrides: list[str], probe: bool) -> str:
    """Start Ray as the run will, and ask one of its worker processes which `cadence` it imports.
    With `probe`, every Ray worker installs the group-timeline probe as it starts."""
    import ray

    from cadence.runtime.connect import connect_ray

    if probe:  # connect_ray's own arguments, plus the probe; train() then finds Ray started and joins it
        ray.cloudpickle.register_pickle_by_value(async_timeline)  # workers cannot import benchmarks/
        ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=True, configure_logging=True,
                 runtime_env={"worker_process_setup_hook": async_timeline.install_group_probe})
    else:
        connect_ray(load_config(None, overrides).runtime)
    return ray.get(ray.remote(cadence_imported).remote())


def run_variant(name: str, overrides: list[str], steps: int, warmup: int, run_dir: Path | None = None,
                probe: bool = False) -> dict:
    """One timed training run; with `run_dir` its metrics and events/ timeline stay there, and with
    `probe` also every engine step, weight swap and group move (async_timeline.py)."""
    load_before = os.getloadavg()
    if probe:
        if run_dir is None:
            raise SystemExit("--group-timeline needs --runs-dir: the probe writes into each run's folder")
        (run_dir / "events").mkdir(parents=True, exist_ok=True)
        os.environ[async_timeline.GROUPS_ENV] = str(run_dir / "events")  # inherited by Ray's workers
        async_timeline.install_group_probe()
    ray_cadence = ray_worker_cadence(overrides, probe) if "runtime.kind=ray" in overrides else None
    run = train_run([*COMMON, *LONG_TAIL, *overrides, f"trainer.steps={steps}"], str(run_dir) if run_dir else None)
    cfg, rs, wall = run.cfg, run.records, run.wall_s
    timed, seconds, samples = timed_steps(rs, warmup)
    tokens = sum(r["response/length_mean"] * cfg.batch_size for r in timed)
    split = measured_split(rs[warmup - 1 :], cfg.batch_size, 1, cfg.rollout.async_ratio)
    return {
        "variant": name,
        "steps_timed": len(timed),
        "samples_per_s": samples / seconds,
        "tokens_per_s": tokens / seconds,
        "step_seconds": seconds / len(timed),
        "train_seconds": statistics.mean(r["train/seconds"] for r in timed),
        "engine_busy_fraction": timed[-1].get("rollout/engine_busy_fraction", float("nan")),
        "trainer_idle_s": statistics.mean(r["time/trainer_idle"] for r in timed),
        "staleness_max": max(r["train/staleness_max"] for r in timed),
        "interrupted_fraction": statistics.mean(r["response/interrupted_fraction"] for r in timed),
        "beta_star": split.beta if split else None,
        "mu_gen_s": split.mu_gen if split else None,
        "l_gen_s": split.l_gen if split else None,
        "mu_train_s": split.mu_train if split else None,
        "wall_s": wall,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cadence": cadence_imported(),
        "ray_worker_cadence": ray_cadence,
    }


def slug(variant: str) -> str:
    """A variant's name as a folder name: 'async alpha=2' -> 'async_alpha_2'."""
    return "_".join("".join(c if c.isalnum() else " " for c in variant).split())


GENERATION_MODES = {
    "batch-wise (waves, a prompt's answers together)": {"static_batching": True, "replicate": False},
    "queue scheduling (freed slots refilled)": {"static_batching": False, "replicate": False},
    "queue scheduling + prompt replication": {"static_batching": False, "replicate": True},
}


def batch_generation(engine_kind: str, static_batching: bool, replicate: bool, slots: int = 32, seed: int = 0) -> float:
    """Seconds to generate one training batch (16 prompts x 8 long-tailed answers) via RLVRProducer."""
    # Imported here: the throughput rows alone also run against older cadence (compare_commits.py).
    from cadence.data.build import build_task
    from cadence.inference.hub import InferenceHub
    from cadence.rollout.render import PromptRenderer
    from cadence.rollout.rlvr import RLVRProducer

    torch.set_num_threads(1)  # one engine, one core: the rollout worker's share
    cfg = load_config(None, [*COMMON, *LONG_TAIL])
    tok = load_tokenizer("builtin")
    if engine_kind == "embedded":
        engine = EmbeddedEngine(load_policy("builtin").eval(), tok, max_batch_size=slots, static_batching=static_batching)
    else:  # GPU-like decode: a step costs 20 ms plus 0.05 ms per running row (memory-bound)
        engine = MockEngine(max_batch_size=slots, seed=seed, median_tokens=10**6, max_tokens=None,
                            step_latency_s=0.02, per_token_latency_s=5e-5, virtual_clock=True,
                            static_batching=static_batching)
    task = build_task(cfg.task)
    rng = random.Random(seed)
    sim = cfg.rollout.simulate_lengths
    hub = InferenceHub([engine])
    producer = RLVRProducer(
        hub, PromptRenderer(tok), PromptStream(task.prompts("train", 64, seed), seed), _NoReward(),
        SamplingParams(max_new_tokens=sim.max_tokens, temperature=1.0), cfg.rollout.group_size,
        length_sampler=lambda: max(1, min(sim.max_tokens, round(rng.lognormvariate(math.log(sim.median_tokens), sim.sigma)))),
        replicate=replicate, slots=slots,
    )

    async def one_batch() -> None:
        plays = [producer.play(gid, gid) for gid in range(cfg.rollout.prompts_per_step)]  # key: a stream position
        await hub.serving(asyncio.gather(*plays))

    began = engine.clock() if engine_kind == "mock" else time.perf_counter()
    asyncio.run(one_batch())
    return (engine.clock() if engine_kind == "mock" else time.perf_counter()) - began


class _NoReward:
    """Scoring is not what this table times."""

    async def score(self, prompt: object, response: str) -> RewardOutcome:
        return RewardOutcome(0.0)


def generation_table() -> list[dict]:
    rows = []
    for engine_kind in ("embedded", "mock"):
        for mode, opts in GENERATION_MODES.items():
            seconds = statistics.median(batch_generation(engine_kind, seed=s, **opts) for s in range(3))
            rows.append({"engine": engine_kind, "mode": mode, "seconds": seconds})
    return rows


def write_doc(rows: list[dict], gen: list[dict]) -> None:
    base = rows[0]["samples_per_s"]
    best_sync = max(r["samples_per_s"] for r in rows if r["variant"] in SYNC)
    lines = [
        "| variant | samples/s | tokens/s | x sync (inline) | x best sync | step s | train s | engine busy "
        "| trainer idle s/step | max staleness | responses spanning a weight update |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['samples_per_s']:.1f} | {r['tokens_per_s']:.0f} | {r['samples_per_s'] / base:.2f}x | "
            f"{r['samples_per_s'] / best_sync:.2f}x | {r['step_seconds']:.2f} | {r['train_seconds']:.2f} | "
            f"{r['engine_busy_fraction']:.0%} | {r['trainer_idle_s']:.2f} | {r['staleness_max']:.0f} | "
            f"{r['interrupted_fraction']:.0%} |"
        )
    lines += ["", "| one batch, 16 prompts x 8 long-tailed answers, 32 slots | engine | seconds | x batch-wise |",
              "|---|---|---|---|"]
    for engine_kind in ("embedded", "mock"):
        part = [g for g in gen if g["engine"] == engine_kind]
        label = "embedded (CPU, 1 thread)" if engine_kind == "embedded" else "mock, GPU-like step cost (simulated s)"
        for g in part:
            lines.append(f"| {g['mode']} | {label} | {g['seconds']:.2f} | {part[0]['seconds'] / g['seconds']:.2f}x |")
    sync_ray = next(r for r in rows if r["variant"] == "sync (ray, 1+1 cores)")
    if sync_ray["beta_star"] is not None:
        lines += [
            "",
            f"beta* from the synchronous (ray) run: mu_gen {1e3 * sync_ray['mu_gen_s']:.1f} ms, "
            f"L_gen {sync_ray['l_gen_s']:.2f} s, mu_train {1e3 * sync_ray['mu_train_s']:.1f} ms per sample, "
            f"N = 128, K = 1, alpha = 2: **beta* = "
            f"{beta_star(128, 1, sync_ray['mu_gen_s'], sync_ray['l_gen_s'], sync_ray['mu_train_s'], 2):.2f}** "
            "of the resources to training.",
        ]
    table = "\n".join(lines)
    write_doc_table(DOC, "async", table)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="*", help="run only these variants (names as in the table)")
    ap.add_argument("--no-generation-table", action="store_true", help="skip the batch-generation table")
    ap.add_argument("--runs-dir", type=Path, default=None,
                    help="keep each variant's run (metrics.jsonl, events/) in a folder here, for async_timeline.py")
    ap.add_argument("--group-timeline", action="store_true",
                    help="also log engine steps, weight swaps and group moves into each kept run's events/")
    args = ap.parse_args()
    steps, warmup = (3, 1) if args.quick else (args.steps, args.warmup)
    rows = []
    for name, overrides in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        run_dir = args.runs_dir / slug(name) if args.runs_dir else None
        row = run_variant(name, overrides, steps, warmup, run_dir, args.group_timeline)
        print(json.dumps(row), flush=True)
        rows.append(row)
    gen = [] if args.no_generation_table else generation_table()
    print(json.dumps(gen))
    if args.quick or args.only or args.no_generation_table:
        return
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"throughput": rows, "batch_generation": gen}, indent=2))
    write_doc(rows, gen)


if __name__ == "__main__":
    main()
