"""Does the scheduler scale? Rollout throughput with 1 vs N Ray workers on the mock engine.

    python benchmarks/mock_scaling.py [--workers 1 2 4 8] [--seconds 20]

The mock engine has no model: each decode step sleeps a fixed latency, as a
memory-bound accelerator decode would, so a worker's throughput is set by
its engine and N workers can give N times the throughput only if the
scheduler, the buffer, the reward guard and the weight sync keep up. The
trainer side pulls batches and pushes (unchanged) weights every step, like a
real trainer whose step is instant. ROLL Flash reports 7.6x throughput from
8x the GPUs.

Writes docs/results/mock_scaling.json and the table in docs/async.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from cadence.assemble import rollout_workers
from cadence.config import load_config
from cadence.models.loading import load_policy
from cadence.observe.report import write_doc_table

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "async.md"
RESULTS = ROOT / "docs" / "results" / "mock_scaling.json"


def measure(workers: int, seconds: float) -> dict:
    import ray

    cfg = load_config(
        None,
        [
            "runtime.kind=ray",
            f"runtime.rollout_workers={workers}",
            f"runtime.rollout_cpus={2 / max(workers, 2)}",
            # 32 requests per worker per step (two waves of its 16 slots) whatever the worker
            # count; with prompt replication (the default) every worker answers every prompt.
            f"rollout.prompts_per_step={4 * workers}",
            "rollout.group_size=8",
            "rollout.async_ratio=2",
            "rollout.engine.backend=mock",
            "rollout.engine.max_batch_size=16",
            "rollout.engine.mock.length_dist=fixed",
            "rollout.engine.mock.median_tokens=20",
            "rollout.engine.mock.step_latency_s=0.02",
            "trainer.steps=100000",
            "eval.before=false",
        ],
    )
    group = rollout_workers(cfg)
    weights = load_policy(cfg.model.path).state_dict()
    group.start()
    version, samples = 0, 0
    for _ in range(3):  # warm-up: actors start, queues fill
        samples_batch = group.get_batch(version)
        version += 1
        group.update_weights(weights, version)
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        batch = group.get_batch(version)
        samples += sum(len(g.samples) for g in batch)
        version += 1
        group.update_weights(weights, version)
    elapsed = time.perf_counter() - began
    group.close()
    ray.shutdown()
    del samples_batch
    return {"workers": workers, "samples_per_s": samples / elapsed, "steps": version - 3, "seconds": elapsed}


def write_doc(rows: list[dict]) -> None:
    one = rows[0]["samples_per_s"]
    lines = ["| rollout workers | samples/s | x 1 worker |", "|---|---|---|"]
    lines += [f"| {r['workers']} | {r['samples_per_s']:.1f} | {r['samples_per_s'] / one:.2f}x |" for r in rows]
    table = "\n".join(lines)
    write_doc_table(DOC, "scaling", table)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    rows = []
    for n in args.workers:
        row = measure(n, args.seconds)
        print(json.dumps(row), flush=True)
        rows.append(row)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2))
    write_doc(rows)


if __name__ == "__main__":
    main()
