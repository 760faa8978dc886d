"""The total policy loss: one entry point over the loss zoo (losses.py).

`compute_policy_loss` takes the per-token loss named by the config, applies the
behaviour-policy (mismatch) correction, builds AsyPPO's objective (masks all
ones for every other run), aggregates, and adds the KL term; see its docstring
for the equation and `docs/algorithms.md` for every ratio.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from cadence.algo.aggregation import aggregate
from cadence.algo.asyppo import asyppo_objective_terms
from cadence.algo.kl import kl_loss
from cadence.algo.losses import LossOutput, PolicyLossInputs, get
from cadence.algo.mismatch import mismatch_correction
from cadence.algo.offpolicy_metrics import offpolicy_metrics

if TYPE_CHECKING:
    from cadence.algo.config import AlgorithmConfig


def _check_inputs(inp: PolicyLossInputs) -> None:
    shape = inp.logprobs.shape
    if inp.logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {tuple(shape)}")
    for name in (
        "old_logprobs",
        "advantages",
        "mask",
        "behaviour_logprobs",
        "ref_logprobs",
        "entropy",
        "adv_mask",
        "entropy_mask",
    ):
        value = getattr(inp, name)
        if value is not None and value.shape != shape:
            raise ValueError(
                f"{name} has shape {tuple(value.shape)}, expected {tuple(shape)} like logprobs"
            )
    if inp.sequence_rewards is not None and inp.sequence_rewards.shape != shape[:1]:
        raise ValueError(
            f"sequence_rewards has shape {tuple(inp.sequence_rewards.shape)}, expected ({shape[0]},)"
        )


def _sanitise(inp: PolicyLossInputs) -> PolicyLossInputs:
    """Zero every token tensor outside the mask and detach what must not carry gradient.

    Padding positions may hold anything (-inf logprobs, garbage advantages);
    zeroing them *before* any exp() keeps both the loss and its gradient finite.
    """
    mask = inp.mask.to(inp.logprobs.dtype)
    keep = mask > 0

    def clean(t: Tensor | None, detach: bool) -> Tensor | None:
        if t is None:
            return None
        t = t.detach() if detach else t
        return torch.where(keep, t, torch.zeros_like(t))

    return dataclasses.replace(
        inp,
        logprobs=clean(inp.logprobs, False),
        old_logprobs=clean(inp.old_logprobs, True),
        advantages=clean(inp.advantages, True),
        mask=mask,
        behaviour_logprobs=clean(
            inp.behaviour_logprobs if inp.behaviour_logprobs is not None else inp.old_logprobs, True
        ),
        ref_logprobs=clean(inp.ref_logprobs, True),
        entropy=clean(inp.entropy, False),
        adv_mask=clean(inp.adv_mask, True),
        entropy_mask=clean(inp.entropy_mask, True),
    )


def _masked_mean(x: Tensor, mask: Tensor) -> float:
    return float((x * mask).sum() / mask.sum().clamp(min=1.0))


def compute_policy_loss(
    inputs: PolicyLossInputs,
    cfg: AlgorithmConfig,
    token_denominator: float | None = None,
    seq_denominator: float | None = None,
    kl_coef: float | None = None,
) -> LossOutput:
    """Total policy loss: aggregate(I^A_t * pg_t - entropy_coef * I^H_t * H_t) + kl.coef * KL.

        pg_t = sg(w_mis) * keep_mis * L_t                    L_t from the loss named by cfg.loss
        H_t  = entropy (if inputs.entropy is given; the bonus, hence the minus)
        I^A, I^H = AsyPPO's masks (inputs.adv_mask, inputs.entropy_mask), else all ones;
                   the per-token sum is `asyppo_objective_terms`
        KL   = aggregate(k(log pi_theta, log pi_ref), mask)   if inputs.ref_logprobs is given
                                                             (added only when kl.mode == "loss")

    w_mis, keep_mis: the train/inference mismatch correction (mismatch.py).
    Denominators: pass the full batch's `batch_denominators(mask)` when this
    call sees one micro-batch of it, so micro-batch losses sum to the batch loss.
    `kl_coef`: the coefficient now, when it adapts during a run (the trainer's state); else kl.coef.
    """
    _check_inputs(inputs)
    inp = _sanitise(inputs)
    mask = inp.mask
    agg = dict(
        mode=cfg.aggregation,
        token_denominator=token_denominator,
        seq_denominator=seq_denominator,
        norm_length=cfg.max_response_length,
    )

    token_loss = get(cfg.loss)(inp, cfg)
    correction = mismatch_correction(inp.old_logprobs, inp.behaviour_logprobs, mask, cfg.mismatch)
    per_token = token_loss.per_token * correction.weight * correction.keep
    # One objective for every loss: AsyPPO's, whose masks are all ones unless the critics set them.
    ones = torch.ones_like(mask)
    adv_mask = inp.adv_mask if inp.adv_mask is not None else ones
    entropy_mask = inp.entropy_mask if inp.entropy_mask is not None else ones
    entropy = inp.entropy if inp.entropy is not None else torch.zeros_like(mask)
    beta = cfg.entropy_coef if inp.entropy is not None else 0.0
    objective = asyppo_objective_terms(per_token, entropy, adv_mask, entropy_mask, mask, beta)
    loss = aggregate(objective, mask, **agg)

    with torch.no_grad():
        pg_loss = aggregate(per_token * adv_mask, mask, **agg)
        log_r = inp.logprobs - inp.old_logprobs
        ratio = torch.exp(log_r)
        n_tokens = mask.sum()
        metrics: dict[str, float] = {
            "pg_loss": float(pg_loss.detach()),
            "ratio_mean": _masked_mean(ratio, mask),
            "ratio_max": float(ratio[mask > 0].max()) if n_tokens > 0 else 1.0,
            "ratio_min": float(ratio[mask > 0].min()) if n_tokens > 0 else 1.0,
            # k3 estimate of KL(pi_old || pi_theta) under samples from pi_old: (r - 1) - log r.
            "approx_kl": _masked_mean(torch.expm1(log_r) - log_r, mask),
            "mismatch_weight_mean": _masked_mean(correction.weight, mask),
            "mismatch_masked_fraction": _masked_mean(1.0 - correction.keep, mask),
            # k3 estimate of KL(mu || pi_old) under samples from mu: rho - 1 - log rho.
            "mismatch_kl": _masked_mean(
                torch.expm1(correction.log_ratio) - correction.log_ratio, mask
            ),
            "response_tokens": float(n_tokens),
        }
        metrics |= {name: _masked_mean(value, mask) for name, value in token_loss.stats.items()}
        metrics |= offpolicy_metrics(correction.log_ratio, correction.weight, correction.keep, mask)

    # KL and entropy join the loss only when their tensors are supplied, so a trainer that
    # adds them itself does not count them twice. Supplying them here is the better path:
    # they are then aggregated like the policy term, with the same micro-batch denominators.
    if inp.ref_logprobs is not None:
        kl_term = kl_loss(inp.logprobs, inp.ref_logprobs, mask, cfg.kl, **agg)
        metrics["kl_ref"] = float(kl_term.detach())
        coef = cfg.kl.coef if kl_coef is None else kl_coef
        if cfg.kl.mode == "loss" and coef > 0:
            loss = loss + coef * kl_term
    if inp.entropy is not None:
        metrics["entropy"] = float(aggregate(entropy.detach() * entropy_mask, mask, **agg))

    metrics["loss"] = float(loss.detach())
    return LossOutput(loss, metrics)
