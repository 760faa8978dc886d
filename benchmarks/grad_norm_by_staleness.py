"""What `trainer.grad_norm_by_staleness` costs a training step: on vs off, side by side in one process.

    python benchmarks/grad_norm_by_staleness.py      # ~1 min; writes docs/results/grad_norm_by_staleness.json

`on` runs a mini-batch's micro-batches staleness bucket by bucket (length-sorted
within each) to take each bucket's gradient norm; `off` length-sorts the whole
mini-batch. The batch is async_throughput's workload: the built-in model, 16
groups of 8, response lengths log-normal (median 24, sigma 1, capped at 400),
each group 0, 1 or 2 versions behind (three buckets). One torch thread; the
modes alternate, each on fresh copies of the same weights and batches. The
ratio is why `auto` measures one step in `trainer.grad_norm_by_staleness_every`.
"""

from __future__ import annotations

import copy
import json
import os
import random
import statistics
import time
from pathlib import Path

import torch

from cadence.algo.config import AlgorithmConfig
from cadence.models.loading import load_policy
from cadence.rollout.sample import Group, Sample
from cadence.train.config import TrainerConfig
from cadence.train.trainer import PolicyTrainer

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results" / "grad_norm_by_staleness.json"
VERSION = 10


def long_tailed_groups(rng: random.Random) -> list[Group]:
    groups = []
    for gid in range(16):
        group = Group(group_id=gid, prompt_id=str(gid))
        prompt = [rng.randrange(5, 200) for _ in range(rng.randint(6, 12))]
        version = VERSION - rng.choice([0, 1, 2])
        for _ in range(8):
            n = min(400, max(1, int(rng.lognormvariate(3.18, 1.0))))  # e^3.18 = 24 tokens
            response = [rng.randrange(5, 200) for _ in range(n)]
            group.samples.append(Sample(str(gid), gid, prompt, response, [-1.0] * n, float(rng.random() < 0.5),
                                        version, "stop"))
        groups.append(group)
    return groups


def step_seconds(model: torch.nn.Module, mode: str, batches: list[list[Group]]) -> list[float]:
    trainer = PolicyTrainer(copy.deepcopy(model), TrainerConfig(micro_batch_size=32, grad_norm_by_staleness=mode),
                            AlgorithmConfig(), 1.0, 0)
    trainer.version = VERSION
    seconds = []
    for groups in batches:
        start = time.perf_counter()
        trainer.step(copy.deepcopy(groups))
        seconds.append(time.perf_counter() - start)
    return seconds[1:]  # the first step warms up


def main() -> None:
    torch.set_num_threads(1)
    rng = random.Random(0)
    model = load_policy("builtin")
    batches = [long_tailed_groups(rng) for _ in range(3)]
    runs: dict[str, list[float]] = {"off": [], "on": []}
    load_before = os.getloadavg()
    for rnd in range(3):
        for mode in ("off", "on") if rnd % 2 == 0 else ("on", "off"):
            runs[mode] += step_seconds(model, mode, batches)
    median = {mode: statistics.median(s) for mode, s in runs.items()}
    result = {
        "command": "python benchmarks/grad_norm_by_staleness.py",
        "step_seconds": runs,
        "median_step_seconds": median,
        "ratio_on_over_off": median["on"] / median["off"],
        "load_average": [load_before, os.getloadavg()],
    }
    print(f"train step, median: off {median['off']:.3f} s, on {median['on']:.3f} s, on/off {result['ratio_on_over_off']:.2f}x")
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
