"""Corrections for highly stale samples: IcePop, sequence MIS, geometric RS, M2PO.

Each returns (weight, keep) per token, detached, for the mismatch stage
(mismatch.py) to multiply into any loss's per-token term. All of them read
only the log ratio log rho_t = log pi_old(y_t) - log mu(y_t) (trainer's
proximal policy over the engine's behaviour policy, the version that sampled),
already zeroed outside the response mask. With one update per batch
pi_old is pi_theta at the update, so rho is then also pi_theta / mu.

| mode     | weight w_t                        | keep_t                                        |
|----------|-----------------------------------|-----------------------------------------------|
| icepop   | rho_t                             | [low <= rho_t <= high]                        |
| seq_mis  | rho_seq (product, broadcast)      | [rho_seq <= C]                                |
| geo_rs   | 1                                 | [low <= rho_geo <= high] and no rho_t < veto  |
| m2po     | rho_t                             | M2 mask: greedy, see `m2po_keep`              |

Papers:
- IcePop: Ling Team, "Every Step Evolves: Scaling Reinforcement Learning for
  Trillion-Scale Thinking Model" (Ring-1T, arXiv 2510.18855). Its objective is
  GRPO's with the per-token factor M(k) = k if alpha <= k <= beta else 0,
  k = pi_train(y; theta_old) / pi_infer(y; theta_old), alpha = 0.5, beta = 5.
- seq_mis and geo_rs: verl's rollout-correction presets (`seq_mis` = sequence
  IS + sequence rejection with lower bound 0; `geo_rs` = geometric-mean
  rejection + per-token veto, no IS weight), after Liu, Li et al. (2025),
  "When Speed Kills Stability: Demystifying RL Collapse from the
  Training-Inference Mismatch".
- M2PO: Zheng, Zhao, Chen (2025), "Prosperity before Collapse: How Far Can
  Off-Policy RL Reach with Stale Data on LLMs?" (arXiv 2510.01161):
  J = 1/sum|o| sum_{i,t} M_{i,t} r_{i,t} A_{i,t}, with r against the stale
  behaviour policy and the mask M keeping the batch's second moment
  mean (log r)^2 at most tau_M2 = 0.04; no PPO clip.

Rejected tokens stay in the aggregation's denominator (as for every cadence
mask), so rejection shrinks the update instead of re-weighting the rest.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _log_bound(value: float) -> float:
    return math.log(value) if value > 0 else -math.inf


@torch.no_grad()
def icepop(log_ratio: Tensor, low: float, high: float) -> tuple[Tensor, Tensor]:
    """IcePop: w_t = rho_t, keep_t = [low <= rho_t <= high] (two-sided, per token)."""
    lo, hi = _log_bound(low), math.log(high)
    keep = ((log_ratio >= lo) & (log_ratio <= hi)).to(log_ratio.dtype)
    # Clamping before exp() keeps rejected ratios finite; they are multiplied by keep = 0.
    weight = torch.exp(log_ratio.clamp(min=max(lo, -30.0), max=hi))
    return weight, keep


@torch.no_grad()
def seq_mis(seq_log_ratio: Tensor, like: Tensor, cap: float) -> tuple[Tensor, Tensor]:
    """Sequence masked IS: w = rho_seq if rho_seq <= C, the whole sequence dropped otherwise.

    seq_log_ratio [B] is log rho_seq (`sequence_log_ratio`); `like` gives the [B, T] shape.
    """
    log_cap = math.log(cap)
    keep = (seq_log_ratio <= log_cap).to(like.dtype).unsqueeze(-1).expand_as(like)
    weight = torch.exp(seq_log_ratio.clamp(max=log_cap)).unsqueeze(-1).expand_as(like)
    return weight, keep


@torch.no_grad()
def geo_rs(
    log_ratio: Tensor, mask: Tensor, low: float, high: float, veto: float | None
) -> tuple[Tensor, Tensor]:
    """Geometric rejection: keep a sequence iff low <= exp(mean_t log rho_t) <= high and,
    with a veto, no token of it has rho_t < veto. No importance weight (w = 1)."""
    geo = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    keep = (geo >= _log_bound(low)) & (geo <= math.log(high))
    if veto is not None:
        keep &= ~((log_ratio < math.log(veto)) & (mask > 0)).any(-1)
    keep = keep.to(log_ratio.dtype).unsqueeze(-1).expand_as(log_ratio)
    return torch.ones_like(log_ratio), keep


@torch.no_grad()
def m2po_keep(log_ratio: Tensor, mask: Tensor, tau: float) -> Tensor:
    """M2PO's second-moment mask over the tokens of this call.

    M2_t = (log rho_t)^2. Mask tokens in decreasing M2_t order, the fewest that
    bring the mean M2 of the *kept* tokens to at most tau:
        k* = min{k : sum_{j>k} v_j / (N - k) <= tau},  v sorted decreasing,
    and drop the k* largest (the mean of no token at all counts as 0).
    """
    valid = mask > 0
    m2 = log_ratio.square()[valid]
    n = m2.numel()
    keep = torch.ones_like(log_ratio)
    if n == 0:
        return keep
    values, order = torch.sort(m2, descending=True)
    # kept_mean[k] = mean of v[k:], for k = 0..n-1; k = n (all dropped) always qualifies.
    suffix = values.flip(0).cumsum(0).flip(0)
    kept_mean = suffix / torch.arange(n, 0, -1, dtype=values.dtype, device=values.device)
    ok = torch.nonzero(kept_mean <= tau)
    k = int(ok[0]) if len(ok) else n
    flat = torch.ones(n, dtype=log_ratio.dtype, device=log_ratio.device)
    flat[order[:k]] = 0.0
    keep[valid] = flat
    return keep
