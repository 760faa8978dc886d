"""Policy losses as a family: micro-batch exactness, finiteness and the REINFORCE gradient at r = 1."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cadence.algo import losses
from cadence.algo.aggregation import batch_denominators
from cadence.algo.config import AlgorithmConfig
from cadence.algo.losses import PolicyLossInputs
from cadence.algo.policy_loss import compute_policy_loss
from tests.algo.loss_helpers import DT

# ----------------------------------------------------------------------------- micro-batching


@pytest.mark.parametrize("loss", ["ppo", "gspo", "decoupled_ppo", "cispo", "topr", "dr_grpo"])
@pytest.mark.parametrize(
    "aggregation",
    ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"],
)
def test_micro_batch_losses_sum_to_the_full_batch_loss(loss, aggregation):
    g = torch.Generator().manual_seed(1)
    B, L = 6, 5
    old = -torch.rand(B, L, generator=g, dtype=DT) * 3
    logp = (old + 0.3 * torch.randn(B, L, generator=g, dtype=DT)).requires_grad_(True)
    mask = (torch.rand(B, L, generator=g) < 0.7).to(DT)
    mask[3] = 0.0  # an empty row must not change S
    inp = dict(
        old_logprobs=old,
        advantages=torch.randn(B, L, generator=g, dtype=DT),
        mask=mask,
        behaviour_logprobs=old + 0.1 * torch.randn(B, L, generator=g, dtype=DT),
        sequence_rewards=torch.randn(B, generator=g, dtype=DT),
        ref_logprobs=old - 0.2,
        entropy=torch.rand(B, L, generator=g, dtype=DT),
    )
    cfg = AlgorithmConfig(
        loss=loss,
        aggregation=aggregation,
        max_response_length=8,
        kl={"coef": 0.05},
        entropy_coef=0.01,
    )
    full = compute_policy_loss(PolicyLossInputs(logprobs=logp, **inp), cfg).loss
    (full_grad,) = torch.autograd.grad(full, logp)

    n_tok, n_seq = batch_denominators(mask)
    total, micro_grad = 0.0, torch.zeros_like(logp)
    for rows in torch.arange(B).split(4):
        part = {k: v[rows] for k, v in inp.items()}
        lp = logp.detach()[rows].requires_grad_(True)
        out = compute_policy_loss(PolicyLossInputs(logprobs=lp, **part), cfg, n_tok, n_seq)
        (g_part,) = torch.autograd.grad(out.loss, lp)
        micro_grad[rows] = g_part
        total += out.loss.item()
    assert total == pytest.approx(full.item(), abs=1e-12)
    assert torch.allclose(micro_grad, full_grad, atol=1e-12)


# ----------------------------------------------------------------------------- property tests


@st.composite
def random_case(draw):
    B = draw(st.integers(1, 4))
    L = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, L, generator=g, dtype=DT) * 8
    mask = (torch.rand(B, L, generator=g) < draw(st.floats(0.0, 1.0))).to(DT)
    if draw(st.booleans()):
        mask[draw(st.integers(0, B - 1))] = 0.0
    tensors = dict(
        old_logprobs=old,
        advantages=torch.randn(B, L, generator=g, dtype=DT) * 3,
        mask=mask,
        behaviour_logprobs=old + torch.randn(B, L, generator=g, dtype=DT) * 2,
        sequence_rewards=torch.randn(B, generator=g, dtype=DT),
    )
    log_ratio = torch.randn(B, L, generator=g, dtype=DT) * 2  # ratios from ~e^-6 to ~e^6
    return tensors, log_ratio


PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(
    case=random_case(),
    loss=st.sampled_from(sorted(losses.names())),
    aggregation=st.sampled_from(
        ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
    ),
    mismatch=st.sampled_from(["none", "token", "sequence", "mask", "sequence_mask"]),
    dual_clip=st.sampled_from([None, 3.0]),
    cispo_mask=st.booleans(),
)
def test_every_loss_is_finite_on_random_inputs(
    case, loss, aggregation, mismatch, dual_clip, cispo_mask
):
    # Losses weighted by mu themselves refuse a second pi_old/mu weight (a config error).
    assume(not (losses.spec(loss).behaviour_weighted and mismatch in ("token", "sequence")))
    tensors, log_ratio = case
    logp = (tensors["old_logprobs"] + log_ratio).requires_grad_(True)
    cfg = AlgorithmConfig(
        loss=loss,
        aggregation=aggregation,
        max_response_length=6,
        mismatch={"mode": mismatch},
        dual_clip=dual_clip,
        cispo_mask=cispo_mask,
    )
    out = compute_policy_loss(PolicyLossInputs(logprobs=logp, **tensors), cfg)
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert torch.isfinite(out.loss)
    assert torch.isfinite(grad).all()
    assert all(math.isfinite(v) for v in out.metrics.values())


# Every registered loss reduces to REINFORCE's *gradient* -A grad log pi when pi_theta = pi_old = mu:
#   ppo/grpo/dr_grpo: r = 1 sits strictly inside the clip, and d(rA)/d log pi = rA = A
#     (the dual-clip cap -cA, c > 1, exceeds the loss |A| for A < 0, so it is inactive too);
#   gspo: s_i = 1 inside the clip, d s_{i,t} / d log pi_t = s_i = 1;
#   decoupled_ppo: the behaviour weight pi_old/mu = 1;
#   tis / cispo / topr: their detached weights are clamp(1) = 1 (CISPO's mask needs r != 1).
# Loss *values* differ (PPO's is -A, REINFORCE's -A log pi), so gradients are compared.
# Nothing is excluded among the built-in losses; a loss whose math differs at r = 1
# (e.g. one with an extra regulariser) would have to be listed here and skipped.
REINFORCE_EQUIVALENT = sorted(losses.names())


@PROPERTY
@given(
    case=random_case(),
    loss=st.sampled_from(REINFORCE_EQUIVALENT),
    aggregation=st.sampled_from(
        ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
    ),
    dual_clip=st.sampled_from([None, 3.0]),
    cispo_mask=st.booleans(),
)
def test_every_loss_has_the_reinforce_gradient_at_ratio_one(
    case, loss, aggregation, dual_clip, cispo_mask
):
    tensors, _ = case
    tensors = {**tensors, "behaviour_logprobs": tensors["old_logprobs"]}
    grads = []
    for name in (loss, "reinforce"):
        cfg = AlgorithmConfig(
            loss=name,
            aggregation=aggregation,
            max_response_length=6,
            dual_clip=dual_clip,
            cispo_mask=cispo_mask,
        )
        logp = tensors["old_logprobs"].clone().requires_grad_(True)
        out = compute_policy_loss(PolicyLossInputs(logprobs=logp, **tensors), cfg)
        grads.append(torch.autograd.grad(out.loss, logp)[0])
    assert torch.allclose(grads[0], grads[1], atol=1e-12)
