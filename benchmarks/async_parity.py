"""Learning parity: synchronous vs asynchronous (alpha = 2) training, same steps, three seeds.

    python benchmarks/async_parity.py              # the documented table (~6 min on 2 cores)
    python benchmarks/async_parity.py --quick      # smoke run, writes nothing under docs/

`cadence train` on its embedded default (built-in model, 2-digit addition,
16 prompts x 8 answers), for the same number of optimizer steps:

  sync    runtime.kind=inline, alpha = 0 (every sample from the current policy)
  async   runtime.kind=ray, rollout worker on one core and trainer on the other,
          alpha = 2 (samples up to two policy versions old, pi_old recomputed)

Held-out pass@1 (greedy, 200 test prompts) before and after each run. Results
go to docs/results/async_parity.json and the table between the parity markers
of docs/async.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from cadence.observe.report import write_doc_table

# The shared benchmark harness lives beside this script (benchmarks/ is not a package).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import train_run  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "async.md"
RESULTS = ROOT / "docs" / "results" / "async_parity.json"
MODES = {
    "sync (alpha=0)": ["runtime.kind=inline", "rollout.async_ratio=0"],
    "async (alpha=2)": ["runtime.kind=ray", "runtime.threads=1", "rollout.async_ratio=2"],
}
COMMON = ["logging.progress=false", "logging.tensorboard=false", "checkpoint.every=0"]


def run(mode: str, seed: int, steps: int, test_size: int) -> dict:
    overrides = [*COMMON, *MODES[mode], f"seed={seed}", f"trainer.steps={steps}", f"task.test_size={test_size}"]
    run = train_run(overrides)
    summary, records, wall = run.summary, run.records, run.wall_s
    return {
        "mode": mode,
        "seed": seed,
        "steps": steps,
        "before": summary.eval_before.pass_at_1,
        "after": summary.eval_after.pass_at_1,
        "train_seconds": summary.seconds,
        "wall_s": wall,
        "staleness_mean": statistics.mean(r["train/staleness_mean"] for r in records),
        "final_reward": statistics.mean(r["reward/mean"] for r in records[-10:]),
    }


def summarise(runs: list[dict]) -> list[dict]:
    out = []
    for mode in MODES:
        mine = [r for r in runs if r["mode"] == mode]
        after = [r["after"] for r in mine]
        out.append({
            "mode": mode,
            "before": statistics.mean(r["before"] for r in mine),
            "after_mean": statistics.mean(after),
            "after_sd": statistics.stdev(after) if len(after) > 1 else 0.0,
            "per_seed": after,
            "train_seconds": statistics.mean(r["train_seconds"] for r in mine),
            "staleness_mean": statistics.mean(r["staleness_mean"] for r in mine),
        })
    return out


def write_doc(summary: list[dict], steps: int, seeds: list[int]) -> None:
    sync = summary[0]
    lines = [
        f"| mode | pass@1 before | pass@1 after, mean ± sd ({len(seeds)} seeds, {steps} steps) | per seed "
        "| vs sync | mean staleness | training s |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        lines.append(
            f"| {s['mode']} | {s['before']:.3f} | {s['after_mean']:.3f} ± {s['after_sd']:.3f} | "
            f"{', '.join(f'{a:.3f}' for a in s['per_seed'])} | {100 * (s['after_mean'] - sync['after_mean']):+.1f} points | "
            f"{s['staleness_mean']:.2f} | {s['train_seconds']:.0f} |"
        )
    table = "\n".join(lines)
    write_doc_table(DOC, "parity", table)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    steps, seeds, test_size = (3, [0], 16) if args.quick else (args.steps, args.seeds, 200)
    runs = []
    for seed in seeds:
        for mode in MODES:
            runs.append(run(mode, seed, steps, test_size))
            print(json.dumps(runs[-1]), flush=True)
    summary = summarise(runs)
    print(json.dumps(summary, indent=2))
    if args.quick:
        return
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"steps": steps, "seeds": seeds, "runs": runs, "summary": summary}, indent=2))
    write_doc(summary, steps, seeds)


if __name__ == "__main__":
    main()
