"""Attention rhythm: token-level credit from the policy's own attention maps.

Implements SPEC section 3 (arXiv 2510.13554). After generation an auxiliary,
eager-attention copy of the policy reads prompt + response once
(`cadence.models.attention`); from the attention maps of a few middle layers
we derive two per-token signals:

- WAAD (windowed average attention distance), read from *local* heads: how far
  back a token looks, capped at W. A jump in WAAD marks the start of a new
  local "chunk" (a phrase or step the model plans as a unit).
- FAI (future attention influence), read from *global* heads: how much later
  tokens (10..100 positions ahead) attend back to a token. High FAI marks an
  "anchor" that the rest of the reasoning keeps returning to.

The credit rules then amplify the advantage of chunk starts (local), anchors
(global), or anchors with part of their credit handed to the token that
introduced them (coupled). The mode (`algorithm.credit`) is an argument; the
constants are `RhythmConfig` (`algorithm.rhythm`).

One implementation, batched: every function takes the samples of one
right-padded forward at once, since a Python loop over samples costs some
twenty small tensor ops per sample, more than the forward itself on short
responses. One sequence is a batch of one (`cadence rhythm`, the tests).
Conventions:
- maps are [B, layers, H, rows, N]; row r is position N - rows + r, so whole
  maps have rows = N and `ActorAttention.maps(..., query_start=q)` gives
  rows = N - q (q <= every sample's response start).
- sample b holds positions 0..n_b - 1 (its `length`; right padding after) and
  its response R_b = {p_b, ..., n_b - 1} (`response_start` p_b).
- per-token outputs are [B, R_max] in response coordinates: entry [b, i] is
  position p_b + i, meaningful where `valid[b, i]` (i < |R_b|), and 0 / False
  / -1 elsewhere.
Masks are applied with masked_fill / where rather than by multiplying: the
rows of pad positions hold whatever the model computed there (NaN when an
attention mask hid every key), and 0 * NaN would leak into the sums.

Where the paper leaves a value open, the choice (a config field where it is a
number) is stated in the docstring of the function that makes it; the coupled
rule follows the public re-implementation the SPEC cites.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

CreditMode = Literal["none", "local", "global", "coupled"]


class RhythmConfig(BaseModel):
    """Attention-rhythm constants (paper defaults); the mode is `algorithm.credit`, not here."""

    model_config = ConfigDict(extra="forbid")

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

    @model_validator(mode="before")
    @classmethod
    def _credit_lives_elsewhere(cls, data: object) -> object:
        # The mode used to be here too (two knobs for one setting): point old configs at the one.
        if isinstance(data, dict) and "credit" in data:
            raise ValueError(
                f"credit is not a rhythm constant; set algorithm.credit={data['credit']} instead"
            )
        return data

    @model_validator(mode="after")
    def _check_horizon(self) -> RhythmConfig:
        if self.fai_min > self.fai_max:
            raise ValueError(f"fai_min ({self.fai_min}) must be <= fai_max ({self.fai_max})")
        return self


# ----------------------------------------------------------------------------
# Layers and where each sample sits in the maps


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


@dataclass
class BatchLayout:
    """Where each sample's response sits in the padded maps (see the module conventions)."""

    valid_rows: torch.Tensor  # [B, rows]: map row r is a response row of sample b
    align: torch.Tensor  # [B, R_max]: map row of response token i (clamped where invalid)
    valid: torch.Tensor  # [B, R_max]: i < |R_b|
    count: torch.Tensor  # [B]: |R_b|
    start: torch.Tensor  # [B]: p_b
    dist: torch.Tensor  # [rows, N]: t - s for t = the row's position, 0 above the diagonal


def batch_layout(
    maps: torch.Tensor, response_start: torch.Tensor, length: torch.Tensor
) -> BatchLayout:
    """Check maps [B, layers, H, rows, N] against each sample's response start and length."""
    if maps.dim() != 5:
        raise ValueError(f"maps must be [B, layers, H, rows, N], got {tuple(maps.shape)}")
    b, rows, n = maps.shape[0], maps.shape[-2], maps.shape[-1]
    device = maps.device
    start = torch.as_tensor(response_start, device=device).long().flatten()
    length = torch.as_tensor(length, device=device).long().flatten()
    if start.numel() != b or length.numel() != b:
        raise ValueError(
            f"{start.numel()} response starts and {length.numel()} lengths for {b} samples"
        )
    first = n - rows  # position of map row 0
    if rows > n or bool((start < first).any() | (start > length).any() | (length > n).any()):
        raise ValueError(
            f"maps with {rows} rows of {n} positions cover positions {first}..{n - 1}; every "
            f"sample needs {first} <= response_start <= length <= {n} (got response_start "
            f"{start.tolist()}, length {length.tolist()})"
        )
    count = length - start
    r_max = max(int(count.max()), 1) if b else 1
    pos = torch.arange(first, n, device=device)
    valid_rows = (pos >= start[:, None]) & (pos < length[:, None])
    i = torch.arange(r_max, device=device)
    align = (start[:, None] - first + i).clamp(max=rows - 1)
    dist = (pos[:, None] - torch.arange(n, device=device)).clamp(min=0).to(torch.float32)
    return BatchLayout(valid_rows, align, i < count[:, None], count, start, dist)


# ----------------------------------------------------------------------------
# Heads


def head_spans(maps: torch.Tensor, layout: BatchLayout) -> torch.Tensor:
    """Attention span of every head: d_(b,l,h) = 1/|R_b| sum_{t in R_b} sum_{s<=t} A[t,s] (t - s).

    [B, layers, H, rows, N] -> [B, layers, H]; pad rows and prompt rows are left
    out. Short spans mean a head reads its neighbourhood (local), long spans
    mean it reaches far back (global).
    """
    per_row = (maps.float() * layout.dist).sum(-1)  # [B, layers, H, rows]
    per_row = per_row.masked_fill(~layout.valid_rows[:, None, None, :], 0.0)
    return per_row.sum(-1) / layout.count.clamp(min=1)[:, None, None].to(per_row.dtype)


def classify_heads(spans: torch.Tensor, fraction: float = 0.3) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat (layer, head) indices [B, k] of each sample's local and global heads; spans [B, ...].

    k = max(1, floor(fraction * n)) heads each: local are the k shortest spans,
    global the k longest. Sorting is stable, so equal spans keep the earlier
    head first in both rankings. With fraction <= 0.5 and n >= 2 the classes
    are disjoint; a single head is both.
    """
    flat = spans.flatten(1)
    n = flat.shape[1]
    if n == 0:
        raise ValueError("classify_heads: no heads")
    k = max(1, math.floor(fraction * n + 1e-9))
    ascending = torch.sort(flat, dim=1, stable=True).indices
    descending = torch.sort(flat, dim=1, descending=True, stable=True).indices
    return ascending[:, :k], descending[:, :k]


def class_maps(
    maps: torch.Tensor, local_idx: torch.Tensor, global_idx: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A_loc and A_glob [B, rows, N]: the mean map of each sample's own head classes."""
    heads = maps.flatten(1, 2).float()  # [B, layers * H, rows, N]

    def mean_of(idx: torch.Tensor) -> torch.Tensor:
        picked = heads.gather(1, idx[:, :, None, None].expand(-1, -1, *heads.shape[-2:]))
        return picked.mean(1)

    return mean_of(local_idx), mean_of(global_idx)


# ----------------------------------------------------------------------------
# Per-token signals


def waad(a_loc: torch.Tensor, layout: BatchLayout, window: int = 10) -> torch.Tensor:
    """Windowed average attention distance: WAAD_(b,t) = sum_{s<=t} A_loc[b,t,s] min(t - s, W).

    [B, rows, N] -> [B, R_max]. Capping at W keeps one far glance from
    dominating: WAAD measures how local a token's reading is, and a jump between
    neighbours marks a chunk boundary.
    """
    per_row = (a_loc * layout.dist.clamp(max=window)).sum(-1)  # [B, rows]
    return per_row.gather(1, layout.align).masked_fill(~layout.valid, 0.0)


def fai(
    a_glob: torch.Tensor, layout: BatchLayout, h_min: int = 10, h_max: int = 100
) -> torch.Tensor:
    """Future attention influence; [B, rows, N] -> [B, R_max].

    FAI_(b,s) = mean over t in R_b with s + h_min <= t <= min(n_b - 1, s + h_max)
    of A_glob[b,t,s], 0 where no such t exists: how strongly the tokens 10..100
    positions later keep attending back to s, i.e. whether s is an anchor.
    Read on each sample's response block [B, R_max (t), R_max (s)].
    """
    r_max, n = layout.valid.shape[1], a_glob.shape[-1]
    rows = a_glob.gather(1, layout.align[:, :, None].expand(-1, -1, n))  # [B, t, N]
    cols = (layout.start[:, None] + torch.arange(r_max, device=a_glob.device)).clamp(max=n - 1)
    block = rows.gather(2, cols[:, None, :].expand(-1, r_max, -1))  # [B, t, s]
    i = torch.arange(r_max, device=a_glob.device)
    gap = i[:, None] - i[None, :]
    # Only t in R_b counts; s beyond R_b then has no t (t > s), so its FAI is 0.
    inside = ((gap >= h_min) & (gap <= h_max))[None] & layout.valid[:, :, None]
    count = inside.sum(1).to(block.dtype)
    return block.masked_fill(~inside, 0.0).sum(1) / count.clamp(min=1.0)


def local_delta(waad_b: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Delta_i = |WAAD_i - WAAD_(i+1)| per row, 0 for each row's last token and padding."""
    delta = torch.zeros_like(waad_b)
    delta[:, :-1] = (waad_b[:, :-1] - waad_b[:, 1:]).abs().masked_fill(~valid[:, 1:], 0.0)
    return delta


def top_q_mask(score: torch.Tensor, valid: torch.Tensor, q: float) -> torch.Tensor:
    """Per row, the top ceil(q * |R_b|) valid tokens that also have score > 0 (ties: earlier).

    ceil, so a short response still gets a signal; score > 0, because a zero
    Delta is no chunk boundary and a zero FAI no measured influence (so a
    one-token response, Delta = FAI = 0, is never amplified).
    """
    count = valid.sum(1)
    # float64, like math.ceil(q * r - 1e-9): 0.6 * 5 is 3.0000000000000004, which must give 3.
    k = torch.minimum(count, torch.ceil(q * count.double() - 1e-9).long())
    # Padding sorts last; it sits after every real token, so stable ties still favour earlier.
    order = torch.sort(
        score.masked_fill(~valid, -math.inf), dim=1, descending=True, stable=True
    ).indices
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(order.shape[1], device=order.device).expand_as(order))
    return (rank < k[:, None]) & (score > 0) & valid


# ----------------------------------------------------------------------------
# Credit


def coupled_thresholds(
    waad_b: torch.Tensor,
    delta: torch.Tensor,
    valid: torch.Tensor,
    cfg: RhythmConfig,
    trained: torch.Tensor | None = None,
) -> tuple[torch.Tensor | float, torch.Tensor | float]:
    """tau_waad and tau_Delta of each row: [B, 1] medians over its tokens, or the set numbers.

    The last token's Delta is an artificial 0 (no successor): left out of the median.
    With `trained` the medians are over the trained tokens only (see `credit_selection`).
    """

    def threshold(rule: str | float, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor | float:
        if rule != "median":
            return float(rule)
        # nanquantile over a row is the quantile of its non-NaN (kept) entries.
        return torch.nanquantile(x.float().masked_fill(~keep, math.nan), 0.5, 1, keepdim=True)

    last = valid.sum(1, keepdim=True) - 1
    real = torch.arange(valid.shape[1], device=valid.device) < last
    keep = valid if trained is None else valid & trained
    return threshold(cfg.tau_waad, waad_b, keep), threshold(cfg.tau_delta, delta, real & keep)


@dataclass
class CreditSelection:
    """Which response tokens a credit rule touches, all [B, R_max] (introducer: -1 where none)."""

    gamma: torch.Tensor
    delta: torch.Tensor
    local: torch.Tensor  # T_loc
    anchors: torch.Tensor  # T_glob
    dominated: torch.Tensor  # anchors handing a share to an introducer (coupled only)
    introducer: torch.Tensor  # index of the introducing token of each dominated anchor


def credit_selection(
    waad_b: torch.Tensor,
    fai_b: torch.Tensor,
    valid: torch.Tensor,
    credit: CreditMode,
    cfg: RhythmConfig,
    trained: torch.Tensor | None = None,
) -> CreditSelection:
    """Per-token advantage multipliers gamma (detached, >= 1) and the token sets behind them.

    Per row b, with Delta, T_loc, T_glob and the medians taken over its valid tokens:
      none:    gamma = 1.
      local:   gamma_t = 1 + (gamma_amp - 1) [t in T_loc], T_loc = top-q of Delta.
      global:  gamma_t = 1 + (gamma_amp - 1) [t in T_glob], T_glob = top-q of FAI.
      coupled: global, then each locally dominated anchor a (WAAD_a <= tau_waad and
               max_{k=1..lookback} Delta_{a-k} >= tau_Delta, a - k in the response)
               keeps 1 + (1 - alpha)(gamma_amp - 1) and its introducer
               i = a - argmax_k Delta_{a-k} (ties: nearest) gains alpha (gamma_amp - 1).
    tau_waad and tau_Delta default to the row's medians (`coupled_thresholds`).
    `trained` [B, R_max] (None: every valid token) marks the tokens that carry loss:
    in an agentic episode the observations sit inside the response, and WAAD, FAI
    and Delta are read over them (the model attended to them), but only the model's
    own tokens are ranked, enter the medians, or receive an introducer's share, so
    the top-q budget and the conserved amplification all land where the loss is.
    The hand-over is additive, so total amplification is conserved; an
    introducer of several anchors, or one that is itself an anchor, can exceed
    gamma_amp. Inputs and fields are [B, R_max]; padding keeps gamma = 1, False
    and introducer -1.
    """
    if credit not in get_args(CreditMode):
        raise ValueError(f"credit must be one of {get_args(CreditMode)}, got {credit!r}")
    if not waad_b.shape == fai_b.shape == valid.shape or waad_b.dim() != 2:
        shapes = [tuple(t.shape) for t in (waad_b, fai_b, valid)]
        raise ValueError(f"waad, fai and valid must be the same [B, R], got {shapes}")
    if trained is not None and trained.shape != valid.shape:
        raise ValueError(f"trained must be [B, R] like valid, got {tuple(trained.shape)}")
    waad_b, fai_b, valid = waad_b.detach().float(), fai_b.detach().float(), valid.bool()
    pick = valid if trained is None else valid & trained.to(valid.device).bool()
    b, r = waad_b.shape
    device = waad_b.device
    boost = cfg.gamma_amp - 1.0
    delta = local_delta(waad_b, valid)
    none = torch.zeros(b, r, dtype=torch.bool, device=device)
    gamma = torch.ones(b, r, device=device)
    introducer = torch.full((b, r), -1, dtype=torch.long, device=device)
    local, anchors, dominated = none, none, none.clone()

    if credit == "local":
        local = top_q_mask(delta, pick, cfg.top_q)
        gamma = gamma + boost * local
    elif credit in ("global", "coupled"):
        anchors = top_q_mask(fai_b, pick, cfg.top_q)
        gamma = gamma + boost * anchors

    if credit == "coupled":
        count = valid.sum(1, keepdim=True)
        idx = torch.arange(r, device=device)
        tau_w, tau_d = coupled_thresholds(waad_b, delta, valid, cfg, pick)
        ks = torch.arange(1, cfg.lookback + 1, device=device).unsqueeze(1)
        prev = idx.unsqueeze(0) - ks  # [lookback, R]
        # An introducer must be a trained token: a share handed to an observation is lost.
        outside = (prev < 0).unsqueeze(0) | ~pick[:, prev.clamp(min=0)]
        back = delta[:, prev.clamp(min=0)].masked_fill(outside, -math.inf)  # [B, lookback, R]
        best, k_best = back.max(1)  # ties -> first row, i.e. the nearest token
        dominated = anchors & (waad_b <= tau_w) & (best >= tau_d) & best.isfinite() & (count > 1)
        dst = idx - (k_best + 1)
        introducer = torch.where(dominated, dst, introducer)
        gamma = torch.where(dominated, gamma - cfg.alpha * boost, gamma)
        share = torch.zeros_like(gamma).masked_fill(dominated, cfg.alpha * boost)
        gamma = gamma.scatter_add(1, dst.clamp(min=0), share)

    return CreditSelection(gamma, delta, local, anchors, dominated, introducer)


@dataclass
class RhythmBatch:
    """Rhythm signals and credit of B samples; per-token fields [B, R_max], see `valid`."""

    gamma: torch.Tensor
    valid: torch.Tensor  # [B, R_max]: i < |R_b|
    waad: torch.Tensor
    fai: torch.Tensor
    selection: CreditSelection  # delta, local, anchors, dominated, introducer ([B, R_max])
    spans: torch.Tensor  # [B, layers, H]
    local_heads: torch.Tensor  # [B, k] flat (layer, head) indices
    global_heads: torch.Tensor  # [B, k]

    def to(self, device: torch.device | str) -> RhythmBatch:
        def moved(obj: object) -> dict[str, torch.Tensor]:
            names = [f.name for f in dataclasses.fields(obj) if f.name != "selection"]
            return {name: getattr(obj, name).to(device) for name in names}

        return RhythmBatch(**moved(self), selection=CreditSelection(**moved(self.selection)))

    def gammas(self) -> list[torch.Tensor]:
        """Per-sample gamma vectors [|R_b|] (views into one tensor)."""
        return list(self.gamma[self.valid].split(self.valid.sum(1).tolist()))


def rhythm_credit(
    maps: torch.Tensor,
    response_start: torch.Tensor,
    length: torch.Tensor,
    credit: CreditMode,
    cfg: RhythmConfig,
    trained: torch.Tensor | None = None,
) -> RhythmBatch:
    """Head classes, WAAD, FAI and the `credit` gammas of B right-padded samples at once.

    `maps` [B, layers, H, rows, N] (row r = position N - rows + r), `response_start`
    [B] (p_b) and `length` [B] (n_b, real tokens of row b): head_spans ->
    classify_heads -> class_maps -> waad / fai -> credit_selection. An empty
    response (p_b = n_b) gets no tokens. `trained` [B, R_max] marks the response
    tokens that carry loss (None: all; see `credit_selection`).
    """
    layout = batch_layout(maps, response_start, length)
    spans = head_spans(maps, layout)
    local_idx, global_idx = classify_heads(spans, cfg.head_fraction)
    a_loc, a_glob = class_maps(maps, local_idx, global_idx)
    w = waad(a_loc, layout, cfg.window)
    f = fai(a_glob, layout, cfg.fai_min, cfg.fai_max)
    sel = credit_selection(w, f, layout.valid, credit, cfg, trained)
    return RhythmBatch(sel.gamma, layout.valid, w, f, sel, spans, local_idx, global_idx)
