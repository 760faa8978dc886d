"""Applying attention-rhythm gammas to advantages (SPEC section 3).

The credit rules (`cadence.algo.rhythm`) give one gamma per response token;
the policy loss then sees A~_t = gamma_t * A_t in place of A_t. The gammas are
weights, not a function of the parameters, so they are detached.
"""

from __future__ import annotations

import torch


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
