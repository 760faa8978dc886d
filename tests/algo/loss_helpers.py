"""Shared helpers of the loss tests: log-probs built from the ratios a test wants."""

from __future__ import annotations

import math

import torch

from cadence.algo.config import AlgorithmConfig
from cadence.algo.losses import PolicyLossInputs
from cadence.algo.policy_loss import compute_policy_loss

DT = torch.float64


def T(x) -> torch.Tensor:
    return torch.tensor(x, dtype=DT)


def inputs_from_ratios(ratios, adv, mask=None, old=None, **extra) -> PolicyLossInputs:
    """log pi_theta = log pi_old + log r, with pi_old = 0.5 unless given."""
    ratios = T(ratios)
    old = T(old) if old is not None else torch.full_like(ratios, math.log(0.5))
    logp = (old + ratios.log()).clone().requires_grad_(True)
    mask = T(mask) if mask is not None else torch.ones_like(ratios)
    return PolicyLossInputs(logprobs=logp, old_logprobs=old, advantages=T(adv), mask=mask, **extra)


def inputs_from_probs(pi_theta, pi_old, mu, adv, mask=None, rewards=None) -> PolicyLossInputs:
    """Inputs from probabilities (rows = sequences, columns = tokens): pi_theta carries the gradient."""
    logp = T(pi_theta).log().clone().requires_grad_(True)
    return PolicyLossInputs(
        logprobs=logp,
        old_logprobs=T(pi_old).log(),
        behaviour_logprobs=T(mu).log(),
        advantages=T(adv),
        mask=T(mask) if mask is not None else torch.ones_like(logp),
        sequence_rewards=T(rewards) if rewards is not None else None,
    )


def loss_and_grad(inp: PolicyLossInputs, cfg: AlgorithmConfig, **kw):
    out = compute_policy_loss(inp, cfg, **kw)
    (grad,) = torch.autograd.grad(out.loss, inp.logprobs)
    return out, grad
