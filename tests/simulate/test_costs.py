"""Cost models on hand-computed values (Qwen3-8B shape, H800 numbers)."""

from __future__ import annotations

import math

import pytest

from cadence.simulate.config import SimConfig, WorkloadSpec
from cadence.simulate.costs import (
    decode_step_s,
    engine_latencies,
    kv_bytes_per_token,
    prefill_s,
    replica_slots,
    response_moment,
    train_flops,
    train_step_s,
    weight_bytes,
    weight_sync_s,
)

CFG = SimConfig()  # qwen3-8b shape on an H800 by default


def test_weights_and_kv_cache_bytes():
    assert weight_bytes(CFG.model) == pytest.approx(16.4e9)
    assert kv_bytes_per_token(CFG.model) == 2 * 36 * 8 * 128 * 2 == 147_456


def test_decode_step_reads_weights_and_context_and_computes_per_row():
    m, g, ro = CFG.model, CFG.gpu, CFG.rollout
    bandwidth = 3.35e12 * 0.8
    assert decode_step_s(m, g, ro, 0, 0) == pytest.approx(0.003 + 16.4e9 / bandwidth)  # 9.12 ms
    step = decode_step_s(m, g, ro, rows=64, context=64 * 4096)
    reads = (16.4e9 + 64 * 4096 * 147_456) / bandwidth
    matmuls = 64 * 2 * 8.2e9 / (989e12 * 0.5)
    assert step == pytest.approx(0.003 + reads + matmuls)
    tp2 = CFG.rollout.model_copy(update={"tp": 2})
    assert decode_step_s(m, g, tp2, 64, 64 * 4096) - 0.003 == pytest.approx((step - 0.003) / 2)
    assert prefill_s(m, g, ro, 512) == pytest.approx(512 * 2 * 8.2e9 / (989e12 * 0.5))


def test_training_flops_and_time():
    m, tr = CFG.model, CFG.trainer
    # (3 + 1 extra forward) x (2 P T + 2 layers hidden T^2), T = 1000
    assert train_flops(m, tr, 1000) == pytest.approx(4 * (2 * 8.2e9 * 1000 + 2 * 36 * 4096 * 1000**2))
    seconds = train_step_s(m, CFG.gpu, tr, [1000, 1000], gpus=4)
    assert seconds == pytest.approx(2 * train_flops(m, tr, 1000) / (4 * 989e12 * 0.35))
    assert weight_sync_s(m, tr) == pytest.approx(16.4e9 / 25e9)


def test_capped_lognormal_moments():
    fixed = WorkloadSpec(length_dist="fixed", median_tokens=300, max_tokens=200)
    assert response_moment(fixed, 1) == 200 and response_moment(fixed, 2) == 200**2
    uncapped = WorkloadSpec(median_tokens=1000, sigma=1.0, max_tokens=10**9)
    assert response_moment(uncapped, 1) == pytest.approx(1000 * math.exp(0.5), rel=1e-6)
    assert response_moment(uncapped, 2) == pytest.approx(1000**2 * math.exp(2.0), rel=1e-6)
    at_median = WorkloadSpec(median_tokens=1000, sigma=1.0, max_tokens=1000)  # half the mass capped
    assert response_moment(at_median, 1) < 1000


def test_slots_come_from_kv_memory_and_engine_knobs_scale_with_the_tick():
    free = 80 * 2**30 * 0.9 - 16.4e9
    per_seq = (512 + response_moment(CFG.workload, 1)) * 147_456
    assert replica_slots(CFG) == int(free / per_seq)
    k = CFG.tick()
    assert k == 2048 // 32
    lat = engine_latencies(CFG)
    m, g, ro = CFG.model, CFG.gpu, CFG.rollout
    assert lat.step_latency_s == pytest.approx(k * decode_step_s(m, g, ro, 0, 0))
    assert lat.per_token_latency_s == pytest.approx(k * 2 * 8.2e9 / (989e12 * 0.5))
    assert lat.context_latency_s == pytest.approx(k * k * 147_456 / (3.35e12 * 0.8))
    assert lat.prefill_latency_s == pytest.approx(k * prefill_s(m, g, ro, 1))
