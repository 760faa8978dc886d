"""Train-inference mismatch correction: pi_old (trainer) vs mu (inference engine).

The engine that samples (vLLM, the embedded engine, possibly in lower
precision or with different kernels) does not compute exactly the
probabilities the trainer computes for the same weights. So even a fully
synchronous run is slightly off-policy: the samples come from mu, while the
loss assumes pi_old. Yao et al. (2025) "Your efficient RL framework secretly
brings you off-policy RL training" correct it with a truncated importance
weight; ROLL and others also offer rejection (masking) of tokens whose ratio
is too far from 1.

Per-token ratio rho_t = pi_old(y_t) / mu(y_t) = exp(log pi_old - log mu).

| mode          | weight applied to the per-token loss                         |
|---------------|--------------------------------------------------------------|
| none          | 1                                                            |
| token         | sg(min(rho_t, C))                                            |
| sequence      | sg(min(rho_seq, C)) for every token of the sequence          |
| mask          | 1 if low <= rho_t <= high else 0                             |
| sequence_mask | 1 if low <= rho_seq <= high else 0, for the whole sequence  |
| icepop        | rho_t if low <= rho_t <= high else 0 (IcePop, Ring-1T)       |
| seq_mis       | rho_seq if rho_seq <= C else 0, whole sequence (verl seq-mis)|
| geo_rs        | 1 if low <= rho_geo <= high and no rho_t < veto, else 0      |
| m2po          | rho_t on tokens M2PO's second-moment mask keeps, else 0      |

The last four are the corrections for highly stale samples; their equations
and papers are in offpolicy.py.

rho_seq is selected by `sequence_ratio`:
- "geometric" (default): exp(mean_t log rho_t), the per-token geometric mean.
  It is what ROLL's sequence-level train/infer ratio uses. It stays near 1
  for long responses, so a cap C means the same thing at any length.
- "product": exp(sum_t log rho_t) = pi_old(y) / mu(y), the exact sequence
  importance weight. Unbiased before truncation, but over thousands of tokens
  it drifts far from 1 and the cap C decides almost everything.
Both are computed in log space and capped before exp(), so they never overflow.

Masked tokens are zeroed in the loss but *stay in the denominator* of the
aggregation, so rejection shrinks the update instead of re-weighting the
surviving tokens, and micro-batch losses still add up exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from cadence.algo import offpolicy

if TYPE_CHECKING:
    from cadence.algo.config import MismatchConfig


# One line per `mismatch.mode`, for `cadence algorithms`; rho = pi_old/mu per token.
MODES: dict[str, str] = {
    "auto": "token for losses whose ratio is against pi_old, none for those weighted by mu (default)",
    "none": "no correction: stale samples trained as if fresh",
    "token": "times sg(min(rho_t, cap)) (Yao et al. 2025)",
    "sequence": "times sg(min(rho_seq, cap)) for the whole sequence",
    "mask": "drop tokens with rho_t outside [low, high]",
    "sequence_mask": "drop sequences with rho_seq outside [low, high]",
    "icepop": "IcePop (Ring-1T): times rho_t inside [0.5, 5], tokens outside dropped",
    "seq_mis": "verl seq-mis: times prod_t rho_t, sequences above cap (2) dropped",
    "geo_rs": "verl geo-rs: drop sequences with geometric-mean rho outside [0.999, 1.001] or a rho_t < 1e-4",
    "m2po": "M2PO (Zheng et al. 2025): times rho_t, largest (log rho_t)^2 dropped until their mean <= 0.04",
}


@dataclass
class MismatchCorrection:
    """Detached per-token multipliers for the per-token loss.

    weight: [B, T] importance weight (1 where no correction).
    keep:   [B, T] 1.0 for kept tokens, 0.0 for rejected ones.
    log_ratio: [B, T] log pi_old - log mu (for metrics).
    """

    weight: Tensor
    keep: Tensor
    log_ratio: Tensor


def sequence_log_ratio(log_ratio: Tensor, mask: Tensor, kind: str) -> Tensor:
    """Per-sequence log ratio [B]: sum_t m log rho_t ("product") or its mean ("geometric")."""
    total = (log_ratio * mask).sum(dim=-1)
    if kind == "product":
        return total
    if kind == "geometric":
        return total / mask.sum(dim=-1).clamp(min=1.0)
    raise ValueError(f"unknown sequence_ratio {kind!r}; valid: geometric, product")


@torch.no_grad()
def mismatch_correction(
    old_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor, cfg: MismatchConfig
) -> MismatchCorrection:
    """Weights and keep-mask that correct mu -> pi_old; see the module table.

    token:    w_t = min(exp(log pi_old - log mu), C)
    sequence: w_t = min(exp(log rho_seq), C) = exp(min(log rho_seq, log C))
    mask:     keep_t = [low <= rho_t <= high]
    sequence_mask: keep_t = [low <= rho_seq <= high]
    Everything is detached (computed under no_grad): these are data, not functions of theta.
    """
    log_ratio = (old_logprobs - behaviour_logprobs) * mask
    ones = torch.ones_like(log_ratio)
    if cfg.mode == "none":
        return MismatchCorrection(ones, ones, log_ratio)

    log_cap = math.log(cfg.cap)
    if cfg.mode == "token":
        weight = torch.exp(log_ratio.clamp(max=log_cap))
        return MismatchCorrection(weight, ones, log_ratio)
    if cfg.mode == "sequence":
        seq = sequence_log_ratio(log_ratio, mask, cfg.sequence_ratio).clamp(max=log_cap)
        weight = torch.exp(seq).unsqueeze(-1).expand_as(log_ratio)
        return MismatchCorrection(weight, ones, log_ratio)

    # Compare in log space: low <= rho <= high  <=>  log low <= log rho <= log high.
    log_low = math.log(cfg.low) if cfg.low > 0 else -math.inf
    log_high = math.log(cfg.high)
    if cfg.mode == "mask":
        keep = ((log_ratio >= log_low) & (log_ratio <= log_high)).to(log_ratio.dtype)
        return MismatchCorrection(ones, keep, log_ratio)
    if cfg.mode == "sequence_mask":
        seq = sequence_log_ratio(log_ratio, mask, cfg.sequence_ratio)
        keep_seq = ((seq >= log_low) & (seq <= log_high)).to(log_ratio.dtype)
        return MismatchCorrection(ones, keep_seq.unsqueeze(-1).expand_as(log_ratio), log_ratio)
    if cfg.mode == "icepop":
        return MismatchCorrection(*offpolicy.icepop(log_ratio, cfg.low, cfg.high), log_ratio)
    if cfg.mode == "seq_mis":
        seq = sequence_log_ratio(log_ratio, mask, cfg.sequence_ratio)
        return MismatchCorrection(*offpolicy.seq_mis(seq, log_ratio, cfg.cap), log_ratio)
    if cfg.mode == "geo_rs":
        return MismatchCorrection(*offpolicy.geo_rs(log_ratio, mask, cfg.low, cfg.high, cfg.veto), log_ratio)
    if cfg.mode == "m2po":
        keep = offpolicy.m2po_keep(log_ratio, mask, cfg.m2_threshold)
        # The mask bounds the second moment, so the weight needs no cap; exp of a kept
        # ratio is at most exp(sqrt(N * tau)), a dropped one is clamped before it is zeroed.
        return MismatchCorrection(torch.exp(log_ratio.clamp(-30.0, 30.0)), keep, log_ratio)
    raise ValueError(
        f"unknown mismatch mode {cfg.mode!r}; valid: none, token, sequence, mask, sequence_mask, "
        "icepop, seq_mis, geo_rs, m2po"
    )
