"""The simulator against ROLL Flash's theory (cadence/runtime/split.py) where the theory is exact.

Exact case: every response the same length (no tail, L_gen -> 0 in the bound) and decode
cost proportional to the rows decoded (memory reads made free), so generation and
training both scale linearly with their GPUs. Then the best async split balances them,
beta* = E mu_train / (mu_gen + E mu_train), and async at that split matches sync
(colocated: the same work done in turns on all GPUs). A long tail breaks the tie in
async's favour.
"""

from __future__ import annotations

import pytest

from cadence.runtime.split import beta_star
from cadence.simulate import sweeps
from cadence.simulate.config import load_sim_config
from cadence.simulate.sim import simulate
from cadence.simulate.theory import theory_inputs

LINEAR = [
    "cluster.gpus=8", "rollout.gpus_per_worker=1", "gpu.hbm_tb_s=1000000", "rollout.step_overhead_s=0",
    "trainer.weight_sync_gb_s=1000000000", "trainer.colocate_switch_s=0",
    "workload.length_dist=fixed", "workload.median_tokens=256", "workload.max_tokens=256",
    "workload.prompt_tokens=64", "workload.prompts_per_step=14", "workload.group_size=4",
    "cluster.alpha=2", "run.steps=4", "run.warmup_steps=3",
]


def test_best_split_is_beta_star_and_async_ties_sync_without_a_tail():
    cfg = load_sim_config(None, None, LINEAR)
    t = theory_inputs(cfg)
    n = cfg.workload.prompts_per_step * cfg.workload.group_size
    beta = beta_star(n, cfg.cluster.gpus, t.mu_gen, 0.0, t.mu_train, cfg.cluster.alpha)
    assert beta == pytest.approx(t.mu_train / (t.mu_gen + t.mu_train))
    rows = sweeps.split(cfg, [1, 2, 3, 4, 5, 6, 7])
    best = max(rows, key=lambda r: r["samples_per_s"])
    assert abs(best["train_gpus"] - beta * 8) <= 1, (beta * 8, [(r["train_gpus"], r["samples_per_s"]) for r in rows])
    ideal = cfg.cluster.gpus / (t.mu_gen + t.mu_train)  # samples/s with no GPU ever idle
    sync = simulate(sweeps.synchronous(cfg))
    assert sync.samples_per_s == pytest.approx(ideal, rel=0.03)  # turns on all GPUs: nothing idles
    assert best["samples_per_s"] <= sync.samples_per_s * 1.02  # async cannot beat a perfect sync
    assert best["samples_per_s"] >= sync.samples_per_s * 0.8  # 8 GPUs cut in whole ones


def test_a_long_tail_makes_async_faster_than_sync():
    cfg = load_sim_config(None, None, [*LINEAR, "workload.length_dist=lognormal", "workload.sigma=1.0",
                                       "workload.max_tokens=4096", "gpu.hbm_tb_s=3.35"])
    row = sweeps.compare(cfg)
    assert row["async_over_sync"] > 1.3, row
    assert row["async_staleness"] <= cfg.cluster.alpha
