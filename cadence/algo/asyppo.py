"""AsyPPO (arXiv 2510.01656): PPO with mini-critics and an uncertainty-aware policy loss.

The recipe, and where each piece lives here:

1. M small critics (M = 2), each trained on a disjoint share of every
   prompt's group of responses: `partition_groups`, `critic_loss` (the
   trainer's `CriticEnsemble.update` sums it over critics, each on its rows).
2. V(s_t) = mean over critics, fed to GAE; sigma_t = their std:
   `aggregate_values`.
3. Tokens where the critics agree most (lowest k of sigma) lose their
   policy-gradient term; tokens where they disagree most (highest h) lose
   their entropy bonus: `uncertainty_masks`, `asyppo_objective_terms` (the
   per-token objective `compute_policy_loss` builds for every loss).

All functions are pure tensor code; the trainer owns models and optimizers.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor


class CriticConfig(BaseModel):
    """Mini-critic settings. The entropy weight beta is `AlgorithmConfig.entropy_coef`."""

    model_config = ConfigDict(extra="forbid")

    num_critics: int = Field(
        2, ge=1, description="Number of mini-critics M; the paper finds 2 gives the step change."
    )
    critic_path: str | None = Field(
        None,
        description="Local HF causal-LM checkpoint to start every critic from (paper: Qwen3-0.6B for a 4B actor). "
        "None: a randomly initialised critic of the policy's family, sized by critic_fraction.",
    )
    critic_fraction: float = Field(
        0.25,
        gt=0,
        le=1,
        description="When critic_path is None: most critic parameters as a fraction of the policy's.",
    )
    critic_lr: float = Field(1e-4, gt=0, description="Learning rate of the critics' optimizer.")
    value_clip: float | None = Field(
        None, gt=0, description="PPO value clipping range around the old values; None: no clipping."
    )
    warmup_steps: int = Field(
        0, ge=0, description="Steps that train only the critics before the policy starts to update."
    )
    adv_mask_low: float = Field(
        0.2,
        ge=0,
        lt=1,
        description="k: fraction of tokens with the lowest critic disagreement that get no PG term.",
    )
    entropy_mask_high: float = Field(
        0.2,
        ge=0,
        le=1,
        description="h: fraction of tokens with the highest disagreement excluded from the entropy bonus.",
    )
    quantile_scope: Literal["batch", "sequence"] = Field(
        "batch",
        description="Rank sigma over all valid tokens of the batch, or within each sequence.",
    )

    @model_validator(mode="after")
    def _masks_fit(self) -> CriticConfig:
        if self.adv_mask_low + self.entropy_mask_high > 1:
            raise ValueError(
                f"adv_mask_low + entropy_mask_high must be <= 1 (got {self.adv_mask_low} + "
                f"{self.entropy_mask_high}): the lowest-k and highest-h token sets would overlap"
            )
        return self


# ---- critics: data partition and loss -----------------------------------------


def partition_groups(
    group_ids: Tensor, num_critics: int, generator: torch.Generator | None = None
) -> Tensor:
    """Which critic trains on each response: an assignment tensor [B] of values in [0, M).

    Within every group (responses to one prompt) the members are shuffled and
    dealt round-robin to the critics starting at a random critic, so shares
    are disjoint, cover the group, differ in size by at most 1, and every
    critic sees every prompt when the group has >= M members. The random start
    spreads the remainder (group size mod M) evenly over critics on average.
    Critic m's rows are `assignment == m`.
    """
    if num_critics < 1:
        raise ValueError(f"num_critics must be >= 1, got {num_critics}")
    device = group_ids.device
    _, group = torch.unique(group_ids, return_inverse=True)
    num_groups = int(group.max()) + 1 if group.numel() else 0
    # Shuffle: order by random key, then (stable) by group -> members of a group are contiguous, in random order.
    order = torch.randperm(group.numel(), generator=generator).to(device)
    order = order[torch.sort(group[order], stable=True).indices]
    sizes = torch.bincount(group, minlength=num_groups)
    starts = torch.cumsum(sizes, 0) - sizes
    rank = torch.arange(group.numel(), device=device) - starts[group[order]]
    offset = torch.randint(num_critics, (num_groups,), generator=generator).to(device)
    assignment = torch.empty_like(group)
    assignment[order] = (rank + offset[group[order]]) % num_critics
    return assignment


def critic_loss(
    values: Tensor,
    returns: Tensor,
    mask: Tensor,
    old_values: Tensor | None = None,
    value_clip: float | None = None,
) -> Tensor:
    """Token-mean of 0.5 * (V - R)^2 over `mask` (pass the critic's own rows only).

    With value clipping (PPO): V_clip = V_old + clip(V - V_old, -c, c) and the
    per-token loss is 0.5 * max((V - R)^2, (V_clip - R)^2), so one update
    cannot move a value far from where the returns were computed.
    Returns 0 (still attached to `values`) when the mask is empty.
    """
    valid = mask.bool()
    # Padding may hold NaN/inf returns: zero them *before* the square, or the
    # backward pass computes 0 * NaN on padded tokens.
    returns = torch.where(valid, returns, 0.0)
    loss = (values - returns) ** 2
    if value_clip is not None:
        if old_values is None:
            raise ValueError("value_clip needs old_values")
        old_values = torch.where(valid, old_values, 0.0)
        clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
        loss = torch.maximum(loss, (clipped - returns) ** 2)
    return 0.5 * torch.where(valid, loss, 0.0).sum() / valid.sum().clamp(min=1)


def aggregate_values(values: Tensor) -> tuple[Tensor, Tensor]:
    """(mean, std) over the critic axis of values [M, B, T].

    mean: V(s_t) = 1/M sum_m V_m(s_t), the value GAE uses (the paper found
    the mean better than the min). std: sigma_t = sqrt(1/M sum_m (V_m - mean)^2),
    the biased (population) std, so M = 1 gives sigma = 0 rather than NaN.
    Only the ranking of sigma matters for the masks, so the choice of bias
    only changes logged magnitudes. Detach the inputs if no gradient is wanted.
    """
    return values.mean(0), values.std(0, correction=0)


# ---- uncertainty-aware policy loss --------------------------------------------


def _rank_masks(sigma: Tensor, valid: Tensor, k: float, h: float) -> tuple[Tensor, Tensor]:
    """Row-wise masks for sigma [R, N] with valid [R, N]; see `uncertainty_masks`."""
    n = valid.sum(-1, keepdim=True)  # valid tokens per row
    # Invalid entries sort to the end, so a row's valid values fill positions [0, n).
    ordered = torch.where(valid, sigma, torch.full_like(sigma, math.inf)).sort(-1).values
    n_low = torch.floor(k * n + 1e-6).long()
    n_high = torch.floor(h * n + 1e-6).long()
    last = sigma.shape[-1] - 1
    # Lowest-k: strictly below the (n_low+1)-th smallest value; all tokens if n_low == n.
    low_cut = ordered.gather(-1, n_low.clamp(max=last))
    low_cut = torch.where(n_low >= n, torch.full_like(low_cut, math.inf), low_cut)
    # Highest-h: strictly above the (n - n_high)-th smallest value; all tokens if n_high == n.
    high_cut = ordered.gather(-1, (n - n_high - 1).clamp(min=0))
    high_cut = torch.where(n_high >= n, torch.full_like(high_cut, -math.inf), high_cut)
    adv_mask = valid & ~(sigma < low_cut)
    entropy_mask = valid & ~(sigma > high_cut)
    return adv_mask, entropy_mask


def uncertainty_masks(
    sigma: Tensor,
    mask: Tensor,
    k: float = 0.2,
    h: float = 0.2,
    scope: Literal["batch", "sequence"] = "batch",
) -> tuple[Tensor, Tensor]:
    """(adv_mask, entropy_mask) [B, T]: I^A_t and I^H_t from critic disagreement sigma_t.

    I^A_t = 0 for tokens whose sigma_t is among the lowest k fraction (critics
    agree: the advantage there is mostly noise), else 1.
    I^H_t = 0 for tokens among the highest h fraction (critics disagree: no
    entropy push where the state is already uncertain), else 1.
    Ranking is over the valid tokens of the whole batch (scope "batch", as in
    the paper: "lowest k% of the batch"; pass the full batch, not a
    micro-batch) or of each sequence (scope "sequence").

    Rounding and ties: with n valid tokens, the cut is at floor(k * n) (and
    floor(h * n)) tokens, so at most a k (h) fraction is ever masked and short
    sequences may have none masked. A token is masked only if its sigma is
    strictly beyond the cut value: equal sigmas get equal treatment and ties at
    the cut keep their terms. So identical critics (sigma = 0 everywhere, e.g.
    at initialisation) mask nothing and the loss is plain PPO. With distinct
    values exactly floor(k * n) tokens are masked. Both masks are 0 on padding,
    so they can be used as loss weights directly; they carry no gradient.
    """
    sigma, valid = sigma.detach(), mask.bool()
    if scope == "batch":
        adv, ent = _rank_masks(sigma.reshape(1, -1), valid.reshape(1, -1), k, h)
        adv, ent = adv.view_as(valid), ent.view_as(valid)
    elif scope == "sequence":
        adv, ent = _rank_masks(sigma, valid, k, h)
    else:
        raise ValueError(f"scope must be 'batch' or 'sequence', got {scope!r}")
    return adv.to(sigma.dtype), ent.to(sigma.dtype)


def asyppo_objective_terms(
    per_token_pg_loss: Tensor,
    entropy: Tensor,
    adv_mask: Tensor,
    entropy_mask: Tensor,
    mask: Tensor,
    beta: float,
) -> Tensor:
    """Per-token AsyPPO loss [B, T]: I^A_t * L^clip_t - beta * I^H_t * H_t (0 on padding).

    The paper maximises E[ 1/|o| sum_t ( I^A_t * PPO_clip_t + beta * I^H_t * H_t ) ];
    as a loss that is the negation, with `per_token_pg_loss` = -PPO_clip_t.
    Aggregate with 1/|o| per sequence, then mean over sequences
    (`cadence.algo.aggregation.aggregate(..., "seq-mean-token-mean")`).

    The masks gate the terms *that reach the gradient*: `entropy` must be the
    differentiable entropy of the current logits, and masked tokens contribute
    exactly zero gradient (selected out with `torch.where`, so a non-finite
    term on a masked token does not poison the forward sum either). Masking a
    detached entropy, or the entropy after it was added to the loss, leaves
    the entropy filter with no effect.
    """
    keep_pg = adv_mask.bool() & mask.bool()
    keep_ent = entropy_mask.bool() & mask.bool()
    zero = per_token_pg_loss.new_zeros(())
    pg = torch.where(keep_pg, per_token_pg_loss, zero)
    ent = torch.where(keep_ent, entropy, zero)
    return pg - beta * ent


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 - Var[R - V] / Var[R] over valid tokens: 1 is a perfect critic, 0 predicts the mean.

    Population variances over the masked tokens; NaN when the returns have no
    variance (nothing to explain) or there are no valid tokens.
    """
    valid = mask.bool()
    v, r = values.detach()[valid].double(), returns.detach()[valid].double()
    if r.numel() == 0:
        return math.nan
    var_r = r.var(correction=0)
    if var_r == 0:
        return math.nan
    return float(1 - (r - v).var(correction=0) / var_r)
