"""Per-step signals that an off-policy run is going off the rails (logged as `offpolicy/*`).

All read the per-token log ratio log rho_t = log pi_old(y_t) - log mu(y_t)
(trainer's proximal policy over the engine's behaviour policy) and the
correction the mismatch stage applied, over response tokens (mask m):

    offpolicy/ess            (sum w)^2 / (n sum w^2), w = rho_t over the n response tokens:
                             1 when every weight is equal, 1/n when one token holds them all
    offpolicy/ess_seq        the same over sequences, w_i = prod_t rho_t = pi_old(y_i) / mu(y_i)
    offpolicy/masked_frac    share of response tokens the correction rejected (keep = 0)
    offpolicy/truncated_frac share of kept tokens whose weight is below rho_t (truncated at a cap)
    offpolicy/kl_mu_pi_old   KL(mu || pi_old), k3 estimate under mu's samples: mean(rho - 1 - log rho)

The ESS uses the raw ratios, not the corrected weights: it measures the data
(how far the samples are from the policy being trained), whatever correction
runs, so runs with different corrections read on one scale. VCPO (Huang et al.
2026) finds collapse reliably preceded by a falling ESS.
ESS is computed in log space (logsumexp), so a sequence ratio of e^500 is fine.
"""

from __future__ import annotations

import torch
from torch import Tensor


def normalised_ess(log_weights: Tensor) -> float:
    """(sum w)^2 / (n sum w^2) for w = exp(log_weights) (a 1-D tensor); 1.0 for no weights."""
    n = log_weights.numel()
    if n == 0:
        return 1.0
    log_weights = log_weights.double()
    log_ess = 2 * torch.logsumexp(log_weights, 0) - torch.logsumexp(2 * log_weights, 0)
    # <= 1 by Cauchy-Schwarz; the min() only absorbs rounding when every weight is equal.
    return min(1.0, float(torch.exp(log_ess) / n))


@torch.no_grad()
def offpolicy_metrics(log_ratio: Tensor, weight: Tensor, keep: Tensor, mask: Tensor) -> dict[str, float]:
    """The `offpolicy/*` metrics of one batch; see the module docstring for each formula."""
    valid = mask > 0
    n = valid.sum().clamp(min=1)
    tokens = log_ratio[valid]
    rows = valid.any(-1)
    seq = (log_ratio * mask).sum(-1)[rows]
    rejected = (1.0 - keep)[valid]
    kept = keep[valid] > 0
    truncated = (weight[valid] < torch.exp(tokens) * (1 - 1e-6)) & kept
    return {
        "offpolicy/ess": normalised_ess(tokens),
        "offpolicy/ess_seq": normalised_ess(seq),
        "offpolicy/masked_frac": float(rejected.sum() / n),
        "offpolicy/truncated_frac": float(truncated.sum() / n),
        "offpolicy/kl_mu_pi_old": float((torch.expm1(tokens) - tokens).sum() / n),
    }
