"""Attention-rhythm credit batched over the samples of one forward.

The same quantities as the per-sample definitions in `cadence.algo.rhythm`
(head spans, head classes, WAAD, FAI, Delta, top-q and the credit rules, with
the equations there), for every row of a right-padded batch at once. A Python
loop over samples costs some twenty small tensor ops per sample, which on
short responses cost more than the forward itself; these compute the same
numbers (up to float summation order) and the same selections, which the tests
check against the per-sample functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from cadence.algo.rhythm import CreditSelection, RhythmConfig

# ----------------------------------------------------------------------------
# Batched over the samples of one forward
#
# Same quantities as above for every row of a right-padded batch. Conventions:
# - maps are [B, layers, H, rows, N]; row r is position N - rows + r, so whole
#   maps have rows = N and `ActorAttention.maps(..., query_start=q)` gives
#   rows = N - q (q <= every sample's response start).
# - sample b holds positions 0..n_b - 1 (its `length`; right padding after) and
#   its response R_b = {p_b, ..., n_b - 1} (`response_start` p_b).
# - per-token outputs are [B, R_max] in response coordinates: entry [b, i] is
#   position p_b + i, meaningful where `valid[b, i]` (i < |R_b|), and 0 / False
#   / -1 elsewhere. Row b cut to valid[b] equals the per-sample result.
# Masks are applied with masked_fill / where rather than by multiplying: the
# rows of pad positions hold whatever the model computed there (NaN when an
# attention mask hid every key), and 0 * NaN would leak into the sums.


@dataclass
class BatchLayout:
    """Where each sample's response sits in the padded maps (see the conventions above)."""

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
        raise ValueError(f"batched maps must be [B, layers, H, rows, N], got {tuple(maps.shape)}")
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


def head_spans_batch(maps: torch.Tensor, layout: BatchLayout) -> torch.Tensor:
    """`head_spans` of every sample: d_(b,l,h) = 1/|R_b| sum_{t in R_b} sum_{s<=t} A[t,s] (t - s).

    [B, layers, H, rows, N] -> [B, layers, H]; pad rows and prompt rows are left out.
    """
    per_row = (maps.float() * layout.dist).sum(-1)  # [B, layers, H, rows]
    per_row = per_row.masked_fill(~layout.valid_rows[:, None, None, :], 0.0)
    return per_row.sum(-1) / layout.count.clamp(min=1)[:, None, None].to(per_row.dtype)


def classify_heads_batch(
    spans: torch.Tensor, fraction: float = 0.3
) -> tuple[torch.Tensor, torch.Tensor]:
    """`classify_heads` per sample: spans [B, ...] -> local and global flat head indices [B, k]."""
    flat = spans.flatten(1)
    n = flat.shape[1]
    if n == 0:
        raise ValueError("classify_heads_batch: no heads")
    k = max(1, math.floor(fraction * n + 1e-9))
    ascending = torch.sort(flat, dim=1, stable=True).indices
    descending = torch.sort(flat, dim=1, descending=True, stable=True).indices
    return ascending[:, :k], descending[:, :k]


def class_maps_batch(
    maps: torch.Tensor, local_idx: torch.Tensor, global_idx: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`class_maps` per sample: A_loc and A_glob [B, rows, N], each sample with its own heads."""
    heads = maps.flatten(1, 2).float()  # [B, layers * H, rows, N]

    def mean_of(idx: torch.Tensor) -> torch.Tensor:
        picked = heads.gather(1, idx[:, :, None, None].expand(-1, -1, *heads.shape[-2:]))
        return picked.mean(1)

    return mean_of(local_idx), mean_of(global_idx)


def waad_batch(a_loc: torch.Tensor, layout: BatchLayout, window: int = 10) -> torch.Tensor:
    """`waad` per sample: WAAD_(b,t) = sum_{s<=t} A_loc[b,t,s] min(t - s, W); [B, rows, N] -> [B, R_max]."""
    per_row = (a_loc * layout.dist.clamp(max=window)).sum(-1)  # [B, rows]
    return per_row.gather(1, layout.align).masked_fill(~layout.valid, 0.0)


def fai_batch(
    a_glob: torch.Tensor, layout: BatchLayout, h_min: int = 10, h_max: int = 100
) -> torch.Tensor:
    """`fai` per sample; [B, rows, N] -> [B, R_max].

    FAI_(b,s) = mean over t in R_b with s + h_min <= t <= min(n_b - 1, s + h_max) of
    A_glob[b,t,s], 0 where no such t exists. Computed on the response block
    [B, R_max (t), R_max (s)] of each sample, indexed from its own response start.
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


def local_delta_batch(waad_b: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """`local_delta` per row: Delta_i = |WAAD_i - WAAD_(i+1)|, 0 for each row's last token and padding."""
    delta = torch.zeros_like(waad_b)
    delta[:, :-1] = (waad_b[:, :-1] - waad_b[:, 1:]).abs().masked_fill(~valid[:, 1:], 0.0)
    return delta


def top_q_mask_batch(score: torch.Tensor, valid: torch.Tensor, q: float) -> torch.Tensor:
    """`top_q_mask` per row: the top ceil(q * |R_b|) valid tokens with score > 0 (ties: earlier)."""
    count = valid.sum(1)
    # Same float64 arithmetic as math.ceil(q * r - 1e-9) in top_q_mask.
    k = torch.minimum(count, torch.ceil(q * count.double() - 1e-9).long())
    # Padding sorts last; it sits after every real token, so stable ties still favour earlier tokens.
    order = torch.sort(
        score.masked_fill(~valid, -math.inf), dim=1, descending=True, stable=True
    ).indices
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(order.shape[1], device=order.device).expand_as(order))
    return (rank < k[:, None]) & (score > 0) & valid


def _threshold_batch(
    rule: Literal["median"] | float, values: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor | float:
    """`_threshold` per row: a [B, 1] tensor of medians over the valid entries, or the number."""
    if rule != "median":
        return float(rule)
    # nanquantile over a row equals quantile over its non-NaN entries, as `_threshold` takes.
    masked = values.float().masked_fill(~valid, math.nan)
    return torch.nanquantile(masked, 0.5, dim=1, keepdim=True)


def credit_selection_batch(
    waad_b: torch.Tensor, fai_b: torch.Tensor, valid: torch.Tensor, cfg: RhythmConfig
) -> CreditSelection:
    """`credit_selection` for every row of [B, R_max] WAAD and FAI at once; fields are [B, R_max].

    Per row b, with Delta, T_loc, T_glob and the medians taken over its valid
    tokens only:
      local:   gamma = 1 + (gamma_amp - 1) [t in T_loc]
      global:  gamma = 1 + (gamma_amp - 1) [t in T_glob]
      coupled: global, then a in T_glob with WAAD_a <= tau_waad and
               max_{k=1..lookback} Delta_{a-k} >= tau_Delta (a - k in the response)
               keeps 1 + (1 - alpha)(gamma_amp - 1) and its introducer
               i = a - argmax_k Delta_{a-k} (ties: nearest) gains alpha (gamma_amp - 1).
    Padding keeps gamma = 1, False and introducer -1.
    """
    if waad_b.shape != fai_b.shape or waad_b.shape != valid.shape or waad_b.dim() != 2:
        raise ValueError(
            f"waad {tuple(waad_b.shape)}, fai {tuple(fai_b.shape)} and valid "
            f"{tuple(valid.shape)} must be the same [B, R]"
        )
    waad_b, fai_b, valid = waad_b.detach().float(), fai_b.detach().float(), valid.bool()
    b, r = waad_b.shape
    device = waad_b.device
    boost = cfg.gamma_amp - 1.0
    delta = local_delta_batch(waad_b, valid)
    none = torch.zeros(b, r, dtype=torch.bool, device=device)
    gamma = torch.ones(b, r, device=device)
    introducer = torch.full((b, r), -1, dtype=torch.long, device=device)
    local, anchors, dominated = none, none, none.clone()

    # The arithmetic below mirrors credit_selection operation for operation, so from
    # the same WAAD and FAI the float32 gammas come out bit for bit the same.
    if cfg.credit == "local":
        local = top_q_mask_batch(delta, valid, cfg.top_q)
        gamma = gamma + boost * local
    elif cfg.credit in ("global", "coupled"):
        anchors = top_q_mask_batch(fai_b, valid, cfg.top_q)
        gamma = gamma + boost * anchors

    if cfg.credit == "coupled":
        count = valid.sum(1, keepdim=True)
        idx = torch.arange(r, device=device)
        tau_w = _threshold_batch(cfg.tau_waad, waad_b, valid)
        # The last token's Delta is an artificial 0: left out of the median.
        tau_d = _threshold_batch(cfg.tau_delta, delta, idx < count - 1)
        ks = torch.arange(1, cfg.lookback + 1, device=device).unsqueeze(1)
        prev = idx.unsqueeze(0) - ks  # [lookback, R]
        back = delta[:, prev.clamp(min=0)].masked_fill(prev < 0, -math.inf)  # [B, lookback, R]
        best, k_best = back.max(1)  # ties -> first row, i.e. the nearest token
        dominated = anchors & (waad_b <= tau_w) & (best >= tau_d) & (idx > 0) & (count > 1)
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
        sel = self.selection
        return RhythmBatch(
            self.gamma.to(device),
            self.valid.to(device),
            self.waad.to(device),
            self.fai.to(device),
            CreditSelection(
                *(
                    t.to(device)
                    for t in (
                        sel.gamma,
                        sel.delta,
                        sel.local,
                        sel.anchors,
                        sel.dominated,
                        sel.introducer,
                    )
                )
            ),
            self.spans.to(device),
            self.local_heads.to(device),
            self.global_heads.to(device),
        )

    def gammas(self) -> list[torch.Tensor]:
        """Per-sample gamma vectors [|R_b|] (views into one tensor)."""
        return list(self.gamma[self.valid].split(self.valid.sum(1).tolist()))


def rhythm_credit_batch(
    maps: torch.Tensor,
    response_start: torch.Tensor,
    length: torch.Tensor,
    cfg: RhythmConfig,
) -> RhythmBatch:
    """Head classes, WAAD, FAI and the `cfg.credit` gammas of B right-padded samples at once.

    `maps` [B, layers, H, rows, N] (row r = position N - rows + r), `response_start`
    [B] (p_b) and `length` [B] (n_b, real tokens of row b). Row b of the result,
    cut to `valid[b]`, is what head_spans -> classify_heads -> class_maps ->
    waad / fai -> credit_selection give for maps[b, ..., :n_b] alone. An empty
    response (p_b = n_b) gets no tokens.
    """
    layout = batch_layout(maps, response_start, length)
    spans = head_spans_batch(maps, layout)
    local_idx, global_idx = classify_heads_batch(spans, cfg.head_fraction)
    a_loc, a_glob = class_maps_batch(maps, local_idx, global_idx)
    w = waad_batch(a_loc, layout, cfg.window)
    f = fai_batch(a_glob, layout, cfg.fai_min, cfg.fai_max)
    sel = credit_selection_batch(w, f, layout.valid, cfg)
    return RhythmBatch(sel.gamma, layout.valid, w, f, sel, spans, local_idx, global_idx)
