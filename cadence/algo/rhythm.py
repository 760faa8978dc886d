"""Attention rhythm: token-level credit from the policy's own attention maps.

Implements SPEC section 3 (arXiv 2510.13554). After generation an auxiliary,
eager-attention copy of the policy reads prompt + response once; from the
attention maps of a few middle layers we derive two per-token signals:

- WAAD (windowed average attention distance), read from *local* heads: how far
  back a token looks, capped at W. A jump in WAAD marks the start of a new
  local "chunk" (a phrase or step the model plans as a unit).
- FAI (future attention influence), read from *global* heads: how much later
  tokens (10..100 positions ahead) attend back to a token. High FAI marks an
  "anchor" that the rest of the reasoning keeps returning to.

The credit rules then amplify the advantage of chunk starts (local), anchors
(global), or anchors with part of their credit handed to the token that
introduced them (coupled). Everything here is pure tensor math;
`cadence.models.attention` produces the maps. Two forms of each step:

- per sample (`head_spans`, `waad`, `fai`, `credit_selection`, ...): one
  sequence, vectorised over tokens. These are the readable definitions, used by
  `cadence rhythm` and as the reference in tests;
- batched (`cadence.algo.rhythm_batched`): every row of a
  right-padded forward at once, with padding masks, for the trainer. A Python
  loop over samples costs some twenty small tensor ops per sample, which on
  short responses cost more than the forward itself. They compute the same
  numbers (up to float summation order) and the same selections.

Conventions used throughout:
- N is the full sequence length (prompt + response), positions 0..N-1.
- `response_start` = p is the first response position; the response positions
  are R = {p, ..., N-1} and every per-token output has length |R| = N - p,
  index i standing for position p + i.
- Attention maps may be passed whole ([..., N, N]) or as response rows only
  ([..., N - p, N]); the latter is what `ActorAttention` returns to save memory.

Rules chosen where the paper leaves values open (all are config fields):
- Top-q selection keeps k = ceil(q * |R|) tokens (so a short response still gets
  a signal), breaking ties toward the earlier token, and only tokens with a
  strictly positive score are eligible: a zero Delta is no chunk boundary and a
  zero FAI is no measured influence. So R = 1 (Delta = FAI = 0) amplifies nothing.
- Delta_t = |WAAD_t - WAAD_{t+1}|; the last response token has no successor and
  gets Delta = 0.
- FAI of a token with no future token inside the horizon (the last `fai_min`
  response tokens) is 0.
- Head classes take k = max(1, floor(fraction * n_heads)) heads from each end of
  the span ranking over all (layer, head) pairs; ties keep the earlier head.
- Coupled: tau_waad and tau_Delta default to the medians of WAAD and of the
  real Deltas (the last token's artificial 0 excluded); alpha = 0.5; the
  introducer of anchor a is argmax_{k=1..lookback} Delta_{a-k} (ties: nearest
  token), looking back within the response only. A locally dominated anchor
  keeps gamma = 1 + (1 - alpha)(gamma_amp - 1) and its introducer gains
  alpha (gamma_amp - 1) on top of whatever it already has (additive, so the
  total amplification is conserved; an introducer of several anchors, or one
  that is itself an anchor, can exceed gamma_amp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

CreditMode = Literal["none", "local", "global", "coupled"]


class RhythmConfig(BaseModel):
    """Attention-rhythm credit settings; defaults follow the paper where it gives a value."""

    model_config = ConfigDict(extra="forbid")

    credit: CreditMode = Field(
        "none",
        description="Which tokens get amplified advantages: none (plain advantages), local "
        "(chunk starts by WAAD jumps), global (anchors by FAI) or coupled (anchors, with "
        "locally dominated anchors sharing credit with their introducing token).",
    )
    window: int = Field(10, ge=1, description="WAAD distance cap W: distances beyond W count as W.")
    fai_min: int = Field(10, ge=1, description="FAI horizon start: t - s >= fai_min.")
    fai_max: int = Field(100, ge=1, description="FAI horizon end: t - s <= fai_max.")
    head_fraction: float = Field(
        0.3,
        gt=0.0,
        le=0.5,
        description="Fraction of (layer, head) pairs classed local (shortest span) and "
        "global (longest span); <= 0.5 so the classes do not overlap.",
    )
    gamma_amp: float = Field(1.5, ge=1.0, description="Advantage multiplier for selected tokens.")
    top_q: float = Field(
        0.4, gt=0.0, le=1.0, description="Fraction of response tokens selected: ceil(top_q * R)."
    )
    both_signs: bool = Field(
        True,
        description="Amplify negative advantages too (later paper version); False amplifies "
        "only tokens with positive advantage.",
    )
    alpha: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Coupled: share of an anchor's amplification passed to its introducer.",
    )
    lookback: int = Field(
        3, ge=1, description="Coupled: previous tokens k = 1..lookback searched for the introducer."
    )
    tau_waad: Literal["median"] | float = Field(
        "median",
        description="Coupled: anchor is locally dominated only if WAAD <= tau_waad; 'median' "
        "uses the median WAAD of the response.",
    )
    tau_delta: Literal["median"] | float = Field(
        "median",
        description="Coupled: ... and max Delta over the look-back window >= tau_delta; "
        "'median' uses the median of the response's Deltas (last token excluded).",
    )
    layers: int = Field(
        5, ge=1, description="Evenly spaced layers read in [floor(L/3), floor(2L/3)]."
    )
    micro_batch: int = Field(
        128,
        ge=1,
        description="Samples per actor_attn forward (the attention pass of a training batch). "
        "Larger is faster on a small model (one forward, one batched credit computation); "
        "peak memory grows as micro_batch x layers x heads x response length x sequence "
        "length floats, so lower it for long sequences.",
    )

    @model_validator(mode="after")
    def _check_horizon(self) -> RhythmConfig:
        if self.fai_min > self.fai_max:
            raise ValueError(f"fai_min ({self.fai_min}) must be <= fai_max ({self.fai_max})")
        return self


# ----------------------------------------------------------------------------
# Layers and heads


def select_layers(num_layers: int, k: int = 5) -> list[int]:
    """k evenly spaced layers in [floor(L/3), floor(2L/3)], rounded half up, deduplicated.

    Middle layers carry the planning structure the paper reads. When the range
    holds fewer than k layers (small models) every layer in it is returned, so
    the list can be shorter than k; it is never empty for L >= 1.
    """
    if num_layers < 1 or k < 1:
        raise ValueError(f"select_layers: need num_layers >= 1 and k >= 1, got {num_layers}, {k}")
    lo, hi = num_layers // 3, (2 * num_layers) // 3
    if k == 1:
        return [(lo + hi) // 2]
    picks = [math.floor(lo + i * (hi - lo) / (k - 1) + 0.5) for i in range(k)]
    return sorted(set(picks))


def _response_rows(attn: torch.Tensor, response_start: int) -> torch.Tensor:
    """The rows t in R of a map given whole [..., N, N] or as response rows [..., N-p, N]."""
    n = attn.shape[-1]
    if not 0 <= response_start < n:
        raise ValueError(f"response_start {response_start} outside a sequence of length {n}")
    rows = attn.shape[-2]
    if rows == n:
        return attn[..., response_start:, :]
    if rows == n - response_start:
        return attn
    raise ValueError(
        f"attention map of shape {tuple(attn.shape)}: expected {n} rows (whole map) or "
        f"{n - response_start} (response rows) for response_start={response_start}"
    )


def _distance(response_start: int, n: int, device: torch.device) -> torch.Tensor:
    """dist[i, s] = t - s for t = response_start + i, clamped at 0 above the diagonal."""
    t = torch.arange(response_start, n, device=device).unsqueeze(1)
    s = torch.arange(n, device=device).unsqueeze(0)
    return (t - s).clamp(min=0).to(torch.float32)


def head_spans(attn: torch.Tensor, response_start: int) -> torch.Tensor:
    """Attention span of every head: d_h = 1/|R| sum_{t in R} sum_{s<=t} A_h[t,s] (t - s).

    `attn` is [H, N, N] (one layer) or [layers, H, N, N] (whole or response rows);
    the result drops the last two dims: [H] or [layers, H]. Short spans mean a
    head reads its neighbourhood (local), long spans mean it reaches far back.
    """
    rows = _response_rows(attn, response_start).float()
    dist = _distance(response_start, attn.shape[-1], attn.device)
    return (rows * dist).sum(-1).mean(-1)


def classify_heads(spans: torch.Tensor, fraction: float = 0.3) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat indices (into spans.flatten()) of the local and global heads.

    k = max(1, floor(fraction * n)) heads each: local are the k shortest spans,
    global the k longest. Sorting is stable, so equal spans keep the earlier
    (layer, head) first in both rankings. With fraction <= 0.5 and n >= 2 the
    classes are disjoint; a single head is both.
    """
    flat = spans.flatten()
    n = flat.numel()
    if n == 0:
        raise ValueError("classify_heads: no heads")
    k = max(1, math.floor(fraction * n + 1e-9))
    ascending = torch.sort(flat, stable=True).indices
    descending = torch.sort(flat, descending=True, stable=True).indices
    return ascending[:k], descending[:k]


def class_maps(
    attn: torch.Tensor, local_idx: torch.Tensor, global_idx: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A_loc and A_glob: the mean map of each head class; attn is [layers, H, rows, N]."""
    heads = attn.reshape(-1, *attn.shape[-2:]).float()
    return heads[local_idx].mean(0), heads[global_idx].mean(0)


# ----------------------------------------------------------------------------
# Per-token metrics


def waad(a_loc: torch.Tensor, response_start: int, window: int = 10) -> torch.Tensor:
    """Windowed average attention distance: WAAD_t = sum_{s<=t} A_loc[t,s] min(t - s, W).

    One value per response token ([N - p]). Capping at W keeps one far glance
    from dominating: WAAD measures how local a token's reading is, and a jump
    between neighbours marks a chunk boundary.
    """
    rows = _response_rows(a_loc, response_start).float()
    dist = _distance(response_start, a_loc.shape[-1], a_loc.device).clamp(max=window)
    return (rows * dist).sum(-1)


def fai(
    a_glob: torch.Tensor, response_start: int, h_min: int = 10, h_max: int = 100
) -> torch.Tensor:
    """Future attention influence: FAI_s = mean_{t in R, s+h_min <= t <= min(N-1, s+h_max)} A_glob[t,s].

    One value per response token s ([N - p]): how strongly the tokens 10..100
    positions later keep attending back to s, i.e. whether s is an anchor.
    Tokens with no future token in the horizon get 0.
    """
    rows = _response_rows(a_glob, response_start).float()
    p = response_start
    cols = rows[:, p:]  # [t, s], both over the response
    r = cols.shape[0]
    gap = torch.arange(r, device=cols.device).unsqueeze(1) - torch.arange(r, device=cols.device)
    inside = ((gap >= h_min) & (gap <= h_max)).to(cols.dtype)
    count = inside.sum(0)
    return (cols * inside).sum(0) / count.clamp(min=1.0)


def local_delta(waad_r: torch.Tensor) -> torch.Tensor:
    """Delta_t = |WAAD_t - WAAD_{t+1}|, with Delta = 0 for the last token (it has no successor)."""
    delta = torch.zeros_like(waad_r)
    delta[:-1] = (waad_r[:-1] - waad_r[1:]).abs()
    return delta


def top_q_mask(score: torch.Tensor, q: float) -> torch.Tensor:
    """The top ceil(q * R) tokens by score that also have score > 0 (ties: earlier token first)."""
    r = score.numel()
    k = min(r, math.ceil(q * r - 1e-9))
    order = torch.sort(score, descending=True, stable=True).indices[:k]
    mask = torch.zeros(r, dtype=torch.bool, device=score.device)
    mask[order] = True
    return mask & (score > 0)


# ----------------------------------------------------------------------------
# Credit


@dataclass
class CreditSelection:
    """Which response tokens a credit rule touches, all [R] (introducer: -1 where none)."""

    gamma: torch.Tensor
    delta: torch.Tensor
    local: torch.Tensor  # T_loc
    anchors: torch.Tensor  # T_glob
    dominated: torch.Tensor  # anchors handing a share to an introducer (coupled only)
    introducer: torch.Tensor  # index of the introducing token of each dominated anchor


def _threshold(rule: Literal["median"] | float, values: torch.Tensor) -> float:
    if rule != "median":
        return float(rule)
    if values.numel() == 0:
        return math.inf
    return float(torch.quantile(values.float(), 0.5))


def credit_selection(
    waad_r: torch.Tensor, fai_r: torch.Tensor, cfg: RhythmConfig
) -> CreditSelection:
    """The gammas of `cfg.credit` with the token sets behind them (see `credit_weights`)."""
    r = waad_r.numel()
    if fai_r.numel() != r:
        raise ValueError(f"waad has {r} tokens but fai has {fai_r.numel()}")
    waad_r, fai_r = waad_r.detach().float(), fai_r.detach().float()
    boost = cfg.gamma_amp - 1.0
    delta = local_delta(waad_r)
    none = torch.zeros(r, dtype=torch.bool, device=waad_r.device)
    gamma = torch.ones(r, device=waad_r.device)
    introducer = torch.full((r,), -1, dtype=torch.long, device=waad_r.device)
    local, anchors, dominated = none, none, none.clone()

    if cfg.credit == "local":
        local = top_q_mask(delta, cfg.top_q)
        gamma = gamma + boost * local
    elif cfg.credit in ("global", "coupled"):
        anchors = top_q_mask(fai_r, cfg.top_q)
        gamma = gamma + boost * anchors

    if cfg.credit == "coupled" and r > 1:
        tau_w = _threshold(cfg.tau_waad, waad_r)
        tau_d = _threshold(cfg.tau_delta, delta[:-1])
        # back[k-1, a] = Delta_{a-k}, -inf where a - k falls before the response.
        idx = torch.arange(r, device=delta.device)
        ks = torch.arange(1, cfg.lookback + 1, device=delta.device).unsqueeze(1)
        prev = idx.unsqueeze(0) - ks
        back = delta[prev.clamp(min=0)].masked_fill(prev < 0, -math.inf)
        best, k_best = back.max(0)  # ties -> first row, i.e. the nearest token
        dominated = anchors & (waad_r <= tau_w) & (best >= tau_d) & (idx > 0)
        src = idx[dominated]
        dst = src - (k_best[dominated] + 1)
        introducer[src] = dst
        gamma[src] -= cfg.alpha * boost
        gamma.index_add_(0, dst, torch.full_like(dst, cfg.alpha * boost, dtype=gamma.dtype))

    return CreditSelection(gamma, delta, local, anchors, dominated, introducer)


def credit_weights(waad_r: torch.Tensor, fai_r: torch.Tensor, cfg: RhythmConfig) -> torch.Tensor:
    """Per-response-token advantage multipliers gamma [R] (detached, >= 1).

    none:    gamma = 1.
    local:   gamma_t = 1 + (gamma_amp - 1) [t in T_loc], T_loc = top-q of Delta.
    global:  gamma_t = 1 + (gamma_amp - 1) [t in T_glob], T_glob = top-q of FAI.
    coupled: global, then each locally dominated anchor a (WAAD_a <= tau_waad and
             max_{k=1..lookback} Delta_{a-k} >= tau_Delta) moves alpha (gamma_amp - 1)
             of its amplification to its introducer i = a - argmax_k Delta_{a-k}.
    """
    return credit_selection(waad_r, fai_r, cfg).gamma


def shape_advantages(
    adv: torch.Tensor,
    gammas: torch.Tensor | list[torch.Tensor],
    mask: torch.Tensor,
    both_signs: bool = True,
) -> torch.Tensor:
    """A~_t = gamma_t A_t on response tokens (mask), gammas detached; returns a new tensor.

    `gammas` is [B, T] aligned with `adv`, or a list of per-sample [R_i] vectors
    laid onto the True positions of each mask row in order (R_i must equal the
    row's mask count). With both_signs=False only positive advantages are
    scaled: amplifying a negative advantage pushes a token down harder, which
    the first paper version avoided.
    """
    if isinstance(gammas, list):
        if len(gammas) != adv.shape[0]:
            raise ValueError(f"{len(gammas)} gamma vectors for a batch of {adv.shape[0]}")
        where = mask.bool()
        counts = where.sum(1).tolist()
        for row, (g, c) in enumerate(zip(gammas, counts, strict=True)):
            if g.numel() != c:
                raise ValueError(f"sample {row}: {g.numel()} gammas but {c} response tokens")
        full = torch.ones_like(adv)
        # Boolean indexing walks the rows in order, so one concatenation fills every
        # row's True positions in order: one op instead of one per sample.
        if gammas:
            full[where] = torch.cat([g.detach().flatten() for g in gammas]).to(adv.dtype)
        gammas = full
    gammas = gammas.detach().to(adv.dtype)
    apply = mask.bool()
    if not both_signs:
        apply = apply & (adv > 0)
    return torch.where(apply, adv * gammas, adv)


def credit_metrics(
    gammas: torch.Tensor | list[torch.Tensor], mask: torch.Tensor | None = None
) -> dict[str, float]:
    """Fraction of response tokens amplified (gamma > 1) and their mean gamma, for logging."""
    if isinstance(gammas, list):
        flat = torch.cat([g.flatten().float() for g in gammas]) if gammas else torch.ones(0)
    else:
        flat = gammas.float()[mask.bool()] if mask is not None else gammas.float().flatten()
    if flat.numel() == 0:
        return {"rhythm/amplified_frac": 0.0, "rhythm/gamma_mean": 1.0}
    return {
        "rhythm/amplified_frac": float((flat > 1.0).float().mean()),
        "rhythm/gamma_mean": float(flat.mean()),
    }
