"""Cost models: memory-bound decode, compute-bound training, weight sync.

Decode, one step of one replica (tp GPUs), `rows` running sequences holding
`context` tokens between them (prompt + generated so far):

    t_step = overhead
             + (weight_bytes + context * kv_bytes_per_token) / (tp * HBM * bw_eff)   reads
             + rows * 2 P / (tp * peak * decode_mfu)                                 matmuls

(a sum of the memory and compute times: an upper bound of the roofline's max,
within ~15% where either dominates). Prefill of p prompt tokens costs
p * 2 P / (tp * peak * prefill_mfu).

Training a sequence of T tokens takes (3 + extra_forwards) forward-equivalents
of 2 P T + 2 layers hidden T^2 FLOPs (weights, then causal attention); a batch
takes its FLOPs over gpus * peak * mfu seconds, times E passes.

The mock engine's step cost is linear in these terms, so `engine_latencies`
maps them onto its knobs; with `tick` tokens per simulated step each knob
pays for `tick` real steps (and context counts in ticks too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from cadence.simulate.config import (
    GPUSpec,
    ModelSpec,
    RolloutSpec,
    SimConfig,
    TrainSpec,
    WorkloadSpec,
)


def weight_bytes(model: ModelSpec) -> float:
    return model.params_b * 1e9 * model.bytes_per_param


def kv_bytes_per_token(model: ModelSpec) -> float:
    """K and V, every layer: 2 * layers * kv_heads * head_dim * bytes."""
    return 2 * model.layers * model.kv_heads * model.head_dim * model.kv_bytes


def decode_step_s(model: ModelSpec, gpu: GPUSpec, ro: RolloutSpec, rows: int, context: int) -> float:
    """Seconds for one decode step of one replica (see module docstring)."""
    bandwidth = ro.tp * gpu.hbm_tb_s * 1e12 * ro.bandwidth_efficiency
    reads = (weight_bytes(model) + context * kv_bytes_per_token(model)) / bandwidth
    matmuls = rows * 2 * model.params_b * 1e9 / (ro.tp * gpu.peak_tflops * 1e12 * ro.decode_mfu)
    return ro.step_overhead_s + reads + matmuls


def prefill_s(model: ModelSpec, gpu: GPUSpec, ro: RolloutSpec, tokens: int) -> float:
    return tokens * 2 * model.params_b * 1e9 / (ro.tp * gpu.peak_tflops * 1e12 * ro.prefill_mfu)


def train_flops(model: ModelSpec, tr: TrainSpec, tokens: int) -> float:
    """FLOPs to train on one sequence of `tokens` tokens (all passes, one epoch)."""
    forward = 2 * model.params_b * 1e9 * tokens + 2 * model.layers * model.hidden * tokens**2
    return (3 + tr.extra_forwards) * forward


def train_step_s(model: ModelSpec, gpu: GPUSpec, tr: TrainSpec, seq_tokens: list[int], gpus: int) -> float:
    """Seconds to train E epochs on sequences of these lengths with `gpus` GPUs."""
    flops = sum(train_flops(model, tr, t) for t in seq_tokens)
    return tr.epochs * flops / (gpus * gpu.peak_tflops * 1e12 * tr.mfu)


def weight_sync_s(model: ModelSpec, tr: TrainSpec) -> float:
    """One broadcast of the full weights to the engines."""
    return weight_bytes(model) / (tr.weight_sync_gb_s * 1e9)


def response_moment(w: WorkloadSpec, n: int) -> float:
    """E[min(X, cap)^n] for X lognormal(ln median, sigma): moments of a capped response length."""
    if w.length_dist == "fixed" or w.sigma == 0:
        return float(min(w.median_tokens, w.max_tokens)) ** n
    mu, s, cap = math.log(w.median_tokens), w.sigma, w.max_tokens
    phi = NormalDist().cdf
    below = math.exp(n * mu + n * n * s * s / 2) * phi((math.log(cap) - mu - n * s * s) / s)
    return below + cap**n * (1 - phi((math.log(cap) - mu) / s))


def mean_context_tokens(cfg: SimConfig) -> float:
    """Tokens a running sequence holds on average: prompt + mean response; for an agentic
    episode, its first observation plus half of its turns' responses and observations."""
    w, env = cfg.workload, cfg.env
    if env is None:
        return w.prompt_tokens + response_moment(w, 1)
    mean_turns = ((env.min_turns or env.turns) + env.turns) / 2
    return w.prompt_tokens + mean_turns * (response_moment(w, 1) + env.observation_tokens) / 2


def replica_slots(cfg: SimConfig) -> int:
    """Sequences one replica holds: KV memory over a mean sequence, at most max_num_seqs."""
    m, ro = cfg.model, cfg.rollout
    free = ro.tp * cfg.gpu.memory_gib * 2**30 * ro.memory_utilization - weight_bytes(m)
    if free <= 0:
        raise ValueError(f"{m.name} does not fit on {ro.tp} x {cfg.gpu.name}: raise rollout.tp")
    per_seq = mean_context_tokens(cfg) * kv_bytes_per_token(m)
    return max(1, min(ro.max_num_seqs, int(free / per_seq)))


@dataclass
class EngineLatencies:
    """The mock engine's knobs (seconds per simulated step, row, prompt tick, context tick)."""

    step_latency_s: float
    per_token_latency_s: float
    prefill_latency_s: float
    context_latency_s: float


def engine_latencies(cfg: SimConfig) -> EngineLatencies:
    """The decode model on the mock engine's linear cost, for `cfg.tick()` tokens per step."""
    m, g, ro, k = cfg.model, cfg.gpu, cfg.rollout, cfg.tick()
    empty = decode_step_s(m, g, ro, rows=0, context=0)
    per_row = decode_step_s(m, g, ro, rows=1, context=0) - empty
    per_context = decode_step_s(m, g, ro, rows=0, context=1) - empty
    return EngineLatencies(
        step_latency_s=k * empty,
        per_token_latency_s=k * per_row,
        prefill_latency_s=k * prefill_s(m, g, ro, 1),  # a prompt tick is k tokens
        context_latency_s=k * k * per_context,  # k steps, each reading k tokens per context tick
    )
