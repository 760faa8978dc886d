"""Synchronous vs asynchronous RLVR throughput under long-tailed response lengths.

    python benchmarks/async_throughput.py            # full table (~5 min on 2 cores)
    python benchmarks/async_throughput.py --quick    # smoke run

Same model (the built-in one), task, batch (16 prompts x 8 answers) and the
machine's 2 cores for every variant, run one after another in this process:

  sync (inline)   one process, both cores, alpha = 0
  sync (ray)      rollout worker on one core, trainer on the other, alpha = 0
  async alpha=k   the same split, rollout up to k policy versions ahead

Response lengths are forced to a log-normal long tail (median 24 tokens,
sigma 1.0, so the longest of a batch is ~10-15x the median) with
`rollout.simulate_lengths`, a benchmark mode of the real embedded engine.
A second table times generating one batch with static batching (a new wave
only when the whole last wave is done) against queue scheduling (freed slots
take new requests at once).

Results go to docs/results/async_throughput.json and the table in
docs/async.md between its markers.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import statistics
import tempfile
import time
from pathlib import Path

import torch

from cadence.config import load_config
from cadence.inference.embedded import EmbeddedEngine
from cadence.inference.types import GenRequest, SamplingParams
from cadence.models.loading import load_policy, load_tokenizer
from cadence.recipes.train_rlvr import train

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
    "eval.before=false",
    "eval.after=false",
    "logging.progress=false",
    "logging.tensorboard=false",
    "checkpoint.every=0",
]
VARIANTS = {
    "sync (inline, 2 threads)": ["runtime.kind=inline", "runtime.threads=2", "rollout.async_ratio=0"],
    "sync (ray, 1+1 cores)": ["runtime.kind=ray", "runtime.threads=1", "rollout.async_ratio=0"],
    "async alpha=1": ["runtime.kind=ray", "runtime.threads=1", "rollout.async_ratio=1"],
    "async alpha=2": ["runtime.kind=ray", "runtime.threads=1", "rollout.async_ratio=2"],
    "async alpha=4": ["runtime.kind=ray", "runtime.threads=1", "rollout.async_ratio=4"],
}


def run_variant(name: str, overrides: list[str], steps: int, warmup: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(None, [*COMMON, *LONG_TAIL, *overrides, f"trainer.steps={steps}", f"logging.run_dir={tmp}"])
        began = time.perf_counter()
        summary = train(cfg)
        wall = time.perf_counter() - began
        rs = [json.loads(x) for x in (summary.run_dir / "metrics.jsonl").read_text().splitlines()]
    if cfg.runtime.kind == "ray":
        import ray

        ray.shutdown()
    timed = rs[warmup:]
    seconds = sum(r["time/step"] for r in timed)
    samples = 128 * len(timed)
    tokens = sum(r["response/length_mean"] * 128 for r in timed)
    return {
        "variant": name,
        "steps_timed": len(timed),
        "samples_per_s": samples / seconds,
        "tokens_per_s": tokens / seconds,
        "step_seconds": seconds / len(timed),
        "engine_busy_fraction": timed[-1].get("rollout/engine_busy_fraction", float("nan")),
        "trainer_idle_s": statistics.mean(r["time/trainer_idle"] for r in timed),
        "staleness_max": max(r["train/staleness_max"] for r in timed),
        "wall_s": wall,
    }


def batch_generation(static: bool, requests: int = 128, max_batch: int = 32, seed: int = 0) -> dict:
    """Time one batch of long-tailed requests through the embedded engine."""
    torch.set_num_threads(1)  # one engine, one core: the rollout worker's share
    tok = load_tokenizer("builtin")
    engine = EmbeddedEngine(load_policy("builtin").eval(), tok, max_batch_size=max_batch, static_batching=static)
    rng = random.Random(seed)
    lengths = [max(1, min(400, round(rng.lognormvariate(math.log(24), 1.0)))) for _ in range(requests)]
    prompt = tok("12+34=").input_ids
    reqs = [
        GenRequest(f"r{i}", prompt, SamplingParams(max_new_tokens=n, temperature=1.0, ignore_eos=True))
        for i, n in enumerate(lengths)
    ]
    began = time.perf_counter()
    engine.generate(reqs)
    seconds = time.perf_counter() - began
    return {"static_batching": static, "seconds": seconds, "tokens": sum(lengths), "longest": max(lengths),
            "median": statistics.median(lengths)}


def write_doc(rows: list[dict], gen: list[dict]) -> None:
    base = rows[0]["samples_per_s"]
    lines = [
        "| variant | samples/s | tokens/s | x sync (inline) | step s | engine busy | trainer idle s/step | max staleness |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['samples_per_s']:.1f} | {r['tokens_per_s']:.0f} | {r['samples_per_s'] / base:.2f}x | "
            f"{r['step_seconds']:.2f} | {r['engine_busy_fraction']:.0%} | {r['trainer_idle_s']:.2f} | {r['staleness_max']:.0f} |"
        )
    static, queue = (next(g for g in gen if g["static_batching"] is s) for s in (True, False))
    lines += [
        "",
        "| one batch of 128 long-tailed requests, 32 slots | seconds | x static |",
        "|---|---|---|",
        f"| static batching (batch-wise waves) | {static['seconds']:.2f} | 1.00x |",
        f"| queue scheduling (freed slots refilled) | {queue['seconds']:.2f} | {static['seconds'] / queue['seconds']:.2f}x |",
    ]
    table = "\n".join(lines)
    text = DOC.read_text() if DOC.exists() else "<!-- async-table-start -->\n<!-- async-table-end -->\n"
    text = re.sub(
        r"<!-- async-table-start -->.*<!-- async-table-end -->",
        f"<!-- async-table-start -->\n{table}\n<!-- async-table-end -->",
        text,
        flags=re.S,
    )
    DOC.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    steps, warmup = (4, 1) if args.quick else (args.steps, args.warmup)
    rows = []
    for name, overrides in VARIANTS.items():
        row = run_variant(name, overrides, steps, warmup)
        print(json.dumps(row))
        rows.append(row)
    gen = [batch_generation(static) for static in (True, False)]
    print(json.dumps(gen))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"throughput": rows, "batch_generation": gen}, indent=2))
    if not args.quick:
        write_doc(rows, gen)


if __name__ == "__main__":
    main()
