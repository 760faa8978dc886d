"""ROLL Flash's theory fed from the cost model: mu_gen, L_gen, mu_train, and the split beta*.

The quantities are in GPU units, as split.py's formula wants them with K the
number of GPUs: mu_gen and mu_train are GPU-seconds per sample, L_gen the
seconds of the longest response of a batch. `suggested_train_gpus` turns
beta* (cadence/runtime/split.py, the one place the formula lives) into a
whole number of training GPUs.

- mu_gen: a replica decoding a full batch of `slots` rows whose time-averaged
  context is prompt + E[L^2] / (2 E[L]) (a long response holds its slot for
  longer, so an average slot holds a longer-than-average response).
- L_gen: the expected longest of N x G responses (the lognormal quantile
  1 - 1/(N G), capped), decoded at the tail's cost: alone on its replica.
- mu_train: E[train FLOPs] of one sequence over peak x MFU, times E.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from cadence.runtime.split import beta_star
from cadence.simulate.config import SimConfig, WorkloadSpec
from cadence.simulate.costs import decode_step_s, prefill_s, replica_slots, response_moment


def longest_response(w: WorkloadSpec) -> float:
    """The expected longest of one batch's N x G responses."""
    if w.length_dist == "fixed" or w.sigma == 0:
        return float(min(w.median_tokens, w.max_tokens))
    count = w.prompts_per_step * w.group_size
    quantile = NormalDist().inv_cdf(1 - 1 / (count + 1))
    return min(float(w.max_tokens), w.median_tokens * math.exp(w.sigma * quantile))


@dataclass
class Theory:
    mu_gen: float  # GPU-seconds of generation per sample
    l_gen: float  # seconds of the longest response
    mu_train: float  # GPU-seconds of training per sample (all epochs)
    slots: int  # sequences a replica decodes together


def theory_inputs(cfg: SimConfig) -> Theory:
    m, g, ro, w, tr = cfg.model, cfg.gpu, cfg.rollout, cfg.workload, cfg.trainer
    slots = replica_slots(cfg)
    mean, square = response_moment(w, 1), response_moment(w, 2)
    context = w.prompt_tokens + square / (2 * mean)
    step = decode_step_s(m, g, ro, rows=slots, context=round(slots * context))
    mu_gen = ro.tp * (mean * step / slots + prefill_s(m, g, ro, w.prompt_tokens))
    longest = longest_response(w)
    l_gen = longest * decode_step_s(m, g, ro, rows=1, context=round(w.prompt_tokens + longest / 2))
    p = w.prompt_tokens
    tokens, tokens_sq = p + mean, p * p + 2 * p * mean + square
    flops = (3 + tr.extra_forwards) * (2 * m.params_b * 1e9 * tokens + 2 * m.layers * m.hidden * tokens_sq)
    mu_train = tr.epochs * flops / (g.peak_tflops * 1e12 * tr.mfu)
    return Theory(mu_gen, l_gen, mu_train, slots)


def suggested_train_gpus(cfg: SimConfig) -> int:
    """beta* x GPUs, rounded, leaving at least one replica to generate and one GPU to train."""
    t = theory_inputs(cfg)
    w, c = cfg.workload, cfg.cluster
    beta = beta_star(w.prompts_per_step * w.group_size, c.gpus, t.mu_gen, t.l_gen, t.mu_train / cfg.trainer.epochs,
                     c.alpha, cfg.trainer.epochs)
    return min(c.gpus - cfg.rollout.tp, max(1, round(beta * c.gpus)))
