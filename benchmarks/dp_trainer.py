"""Data-parallel trainer: step time and weight-sync time of 1 rank vs 2 ranks (DDP, FSDP).

    python benchmarks/dp_trainer.py            # the documented table (~3 min on 2 cores)
    python benchmarks/dp_trainer.py --quick    # smoke run, writes nothing under docs/

The same rollout batches go to three trainers, started once and stepped in
turn (round-robin, so a busy spell of the shared machine hits all three alike):

  DP=1        the one-process PolicyTrainer, one torch thread
  DP=2 ddp    two spawned ranks (gloo), one thread each, DistributedDataParallel
  DP=2 fsdp   the same with FSDP2 (fully_shard per decoder layer + root)

step_s is the driver's wall time of `trainer.step(groups)` (for the ranks:
sending the batch, their forward/backward on token-balanced shares, the
gradient all-reduce, the optimizer step, answering); sync_s is
`trainer.weights()`, the full state dict the engines get (one process: a
state_dict() call; ranks: gathered and pickled back by rank 0). Rollout and the
engine-side weight load are the same for all three and left out. Results go to
docs/results/dp_trainer.json and the table between the dp-trainer markers of
docs/scaling.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from cadence.algo.config import AlgorithmConfig
from cadence.config import RuntimeConfig, TrainerConfig
from cadence.models.tiny import tiny_model
from cadence.observe.report import write_doc_table
from cadence.rollout.sample import Group, Sample
from cadence.runtime.trainer_group import TrainerGroup
from cadence.train.data_parallel import DataParallel
from cadence.train.shard import token_balanced_bins
from cadence.train.trainer import PolicyTrainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import cpu_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "scaling.md"
RESULTS = ROOT / "docs" / "results" / "dp_trainer.json"
MODEL = dict(hidden_size=128, layers=4, heads=4)  # the size of the built-in model


def batch(step: int, prompts: int, group_size: int) -> list[Group]:
    """`prompts` groups with long-tailed response lengths (log-normal, median 24 tokens)."""
    gen = torch.Generator().manual_seed(step)
    groups = []
    for gid in range(prompts):
        g = Group(group_id=gid, prompt_id=str(gid))
        prompt = torch.randint(4, 250, (12,), generator=gen).tolist()
        for j in range(group_size):
            n = int(min(160, max(2, 24 * float(torch.exp(0.8 * torch.randn(1, generator=gen))))))
            resp = torch.randint(4, 250, (n,), generator=gen).tolist()
            reward = float(torch.rand(1, generator=gen) > 0.5)
            g.samples.append(Sample(str(gid), gid, prompt, resp, [-1.0] * n, reward, 0, "stop", f"r{j}"))
        groups.append(g)
    return groups


def build(cfg: TrainerConfig, dp: DataParallel | None = None) -> PolicyTrainer:
    torch.manual_seed(0)
    return PolicyTrainer(tiny_model(**MODEL).train(), cfg, AlgorithmConfig(), 1.0, 0, dp=dp)


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    steps, prompts, group_size = (2, 4, 4) if args.quick else (args.steps, 16, 8)
    torch.set_num_threads(1)
    load_before = os.getloadavg()

    trainers = {"DP=1": build(TrainerConfig(strategy="ddp"))}
    for strategy in ("ddp", "fsdp"):
        cfg = TrainerConfig(strategy=strategy)
        trainers[f"DP=2 {strategy}"] = TrainerGroup(functools.partial(build, cfg), cfg, RuntimeConfig(trainer_workers=2))
    times: dict[str, dict[str, list[float]]] = {name: {"step_s": [], "sync_s": []} for name in trainers}
    losses: dict[str, list[float]] = {name: [] for name in trainers}
    try:
        for step in range(steps + 1):  # step 0 warms up (first forward, allocator)
            groups = batch(step, prompts, group_size)
            for name, trainer in trainers.items():
                metrics, step_s = timed(trainer.step, groups)
                _, sync_s = timed(trainer.weights)
                losses[name].append(metrics["train/loss"])
                if step:
                    times[name]["step_s"].append(step_s)
                    times[name]["sync_s"].append(sync_s)
    finally:
        for trainer in trainers.values():
            if isinstance(trainer, TrainerGroup):
                trainer.close()

    lengths = torch.tensor([len(s.prompt_ids) + len(s.response_ids) for g in batch(1, prompts, group_size)
                            for s in g.samples])
    shares = [int(lengths[b].sum()) for b in token_balanced_bins(lengths, 2)]
    base = statistics.median(times["DP=1"]["step_s"])
    variants = {
        name: {
            "step_s_median": statistics.median(t["step_s"]),
            "sync_s_median": statistics.median(t["sync_s"]),
            "speedup_vs_dp1": base / statistics.median(t["step_s"]),
            "step_s": t["step_s"],
            "sync_s": t["sync_s"],
            "loss": losses[name],
        }
        for name, t in times.items()
    }
    result = {
        "command": "python benchmarks/dp_trainer.py" + (" --quick" if args.quick else ""),
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "model": {**MODEL, "parameters": sum(p.numel() for p in tiny_model(**MODEL).parameters())},
        "batch": {"sequences": prompts * group_size, "tokens_mean": float(lengths.float().mean()),
                  "tokens_max": int(lengths.max()), "rank_token_shares": shares},
        "measured_steps": steps,
        "variants": variants,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "variants"}, indent=1))
    for name, v in variants.items():
        print(f"{name:10s} step {v['step_s_median']:.3f} s  sync {v['sync_s_median'] * 1e3:.1f} ms  "
              f"x{v['speedup_vs_dp1']:.2f}")
    if args.quick:
        return
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "| trainer | step s (median) | vs DP=1 | weight sync ms (median) |",
        "|---|---|---|---|",
        *(f"| {name} | {v['step_s_median']:.3f} | {v['speedup_vs_dp1']:.2f}x | {1e3 * v['sync_s_median']:.1f} |"
          for name, v in variants.items()),
    ]
    write_doc_table(DOC, "dp-trainer", "\n".join(lines))


if __name__ == "__main__":
    main()
