"""Policy losses and mismatch correction: hand-computed values and gradients.

Conventions: a test builds log-probs from the ratios it wants
(log pi_theta = log pi_old + log r), so every number below can be checked by
hand. Gradients are d loss / d log pi_theta(y_t).
"""

from __future__ import annotations

import math

import pytest
import torch

from cadence.algo import losses
from cadence.algo.config import AlgorithmConfig
from cadence.algo.losses import PolicyLossInputs
from cadence.algo.policy_loss import compute_policy_loss
from tests.algo.loss_helpers import DT, T, inputs_from_ratios, loss_and_grad

# ----------------------------------------------------------------------------- registry


def test_registry_lists_every_loss_with_a_description():
    expected = {
        "ppo",
        "grpo",
        "dr_grpo",
        "gspo",
        "decoupled_ppo",
        "tis",
        "cispo",
        "topr",
        "reinforce",
    }
    assert expected <= set(losses.names())
    assert set(losses.describe()) == set(losses.names())
    assert all(line for line in losses.describe().values())
    assert losses.get("ppo") is losses.ppo_loss
    with pytest.raises(KeyError, match="valid: ppo"):
        losses.get("nope")


# ----------------------------------------------------------------------------- PPO family


def test_ppo_clip_values_gradients_and_clip_fraction():
    # r:   0.5   1.0   1.5   0.5   1.5      A: +1 +1 +1 -1 -1, eps 0.2
    # min(rA, clip(r)A): 0.5, 1.0, 1.2 (clipped), -0.8 (clipped), -1.5
    # loss (token-mean) = -(0.5 + 1 + 1.2 - 0.8 - 1.5) / 5 = -0.08
    inp = inputs_from_ratios([[0.5, 1.0, 1.5, 0.5, 1.5]], [[1.0, 1.0, 1.0, -1.0, -1.0]])
    out, grad = loss_and_grad(inp, AlgorithmConfig(loss="ppo"))
    assert out.loss.item() == pytest.approx(-0.08)
    # unclipped tokens: d(-rA)/dlog pi = -rA; clipped tokens: 0.
    assert torch.allclose(grad, T([[-0.5, -1.0, 0.0, 0.0, 1.5]]) / 5)
    assert out.metrics["clip_fraction"] == pytest.approx(0.4)
    assert out.metrics["ratio_max"] == pytest.approx(1.5)
    assert out.metrics["ratio_min"] == pytest.approx(0.5)
    assert out.metrics["ratio_mean"] == pytest.approx(1.0)


def test_ppo_asymmetric_eps():
    # eps_low 0.1, eps_high 0.3.  r=0.85, A=-1 -> clip to 0.9: loss 0.9 (clipped, no grad)
    # r=1.25, A=+1 -> inside: loss -1.25;  r=1.35, A=+1 -> 1.3: loss -1.3 (clipped)
    inp = inputs_from_ratios([[0.85, 1.25, 1.35]], [[-1.0, 1.0, 1.0]])
    out, grad = loss_and_grad(inp, AlgorithmConfig(loss="ppo", eps_low=0.1, eps_high=0.3))
    assert out.loss.item() == pytest.approx((0.9 - 1.25 - 1.3) / 3)
    assert torch.allclose(grad, T([[0.0, -1.25, 0.0]]) / 3)


def test_ppo_dual_clip_caps_negative_advantage_loss():
    # A = -1, c = 3. r=4: -min(-4, -1.2) = 4 > 3 -> capped at 3, no gradient.
    # r=2: loss 2 < 3, untouched, gradient -rA = 2.
    inp = inputs_from_ratios([[4.0, 2.0]], [[-1.0, -1.0]])
    out, grad = loss_and_grad(inp, AlgorithmConfig(loss="ppo", dual_clip=3.0))
    assert out.loss.item() == pytest.approx((3.0 + 2.0) / 2)
    assert torch.allclose(grad, T([[0.0, 2.0]]) / 2)
    assert out.metrics["dual_clip_fraction"] == pytest.approx(0.5)
    # Without the dual clip the r=4 token costs 4.
    out = compute_policy_loss(
        inputs_from_ratios([[4.0, 2.0]], [[-1.0, -1.0]]), AlgorithmConfig(loss="ppo")
    )
    assert out.loss.item() == pytest.approx(3.0)


def test_masked_tokens_are_ignored_even_when_they_hold_garbage():
    # Position 2 is padding: -inf log-prob and NaN advantage must not leak into loss or grad.
    logp = T([[math.log(0.5), math.log(0.5), -math.inf]]).requires_grad_(True)
    inp = PolicyLossInputs(
        logprobs=logp,
        old_logprobs=T([[math.log(0.5), math.log(0.5), 0.0]]),
        advantages=T([[1.0, -1.0, math.nan]]),
        mask=T([[1.0, 1.0, 0.0]]),
    )
    for name in losses.names():
        cfg = AlgorithmConfig(loss=name, max_response_length=3)
        extra = {"sequence_rewards": T([1.0])} if name == "topr" else {}
        out, grad = loss_and_grad(PolicyLossInputs(**{**inp.__dict__, **extra}), cfg)
        assert torch.isfinite(out.loss), name
        assert torch.isfinite(grad).all() and grad[0, 2] == 0, name


def test_grpo_and_dr_grpo_share_the_ppo_token_term():
    inp = inputs_from_ratios([[0.5, 1.5, 1.1]], [[1.0, -1.0, 2.0]])
    ppo = compute_policy_loss(inp, AlgorithmConfig(loss="ppo")).loss
    grpo = compute_policy_loss(inp, AlgorithmConfig(loss="grpo")).loss
    dr = compute_policy_loss(inp, AlgorithmConfig(loss="dr_grpo", aggregation="token-mean")).loss
    assert ppo.item() == pytest.approx(grpo.item()) and ppo.item() == pytest.approx(dr.item())


def test_dr_grpo_divides_by_a_constant_length():
    # Two sequences of lengths 2 and 1, per-token losses -rA = -1 each (r = 1, A = 1).
    # Dr. GRPO: sum of all token losses / (L * S) = -3 / (4 * 2).
    inp = inputs_from_ratios(
        [[1.0, 1.0], [1.0, 1.0]], [[1.0, 1.0], [1.0, 1.0]], mask=[[1, 1], [1, 0]]
    )
    cfg = AlgorithmConfig(loss="dr_grpo", max_response_length=4)
    assert cfg.aggregation == "seq-mean-token-sum-norm" and cfg.std_normalize is False
    assert compute_policy_loss(inp, cfg).loss.item() == pytest.approx(-3 / 8)


# ----------------------------------------------------------------------------- GSPO


def test_gspo_sequence_ratio_clip_and_gradient():
    # seq 0: log r = [0.1, -0.1, 0.3] -> s0 = exp(0.1) = 1.10517 (inside [0.8, 1.2]), A = 1
    # seq 1: log r = [0.5, 0.5, (5.0 masked)] -> s1 = exp(0.5) = 1.6487 > 1.2, A = 1: clipped
    # seq-mean-token-mean: loss = (-s0 + -1.2) / 2
    s0 = math.exp(0.1)
    ratios = [
        [math.exp(0.1), math.exp(-0.1), math.exp(0.3)],
        [math.exp(0.5), math.exp(0.5), math.exp(5.0)],
    ]
    inp = inputs_from_ratios(ratios, [[1.0] * 3, [1.0] * 3], mask=[[1, 1, 1], [1, 1, 0]])
    cfg = AlgorithmConfig(loss="gspo", gspo_eps_low=0.2, gspo_eps_high=0.2)
    assert cfg.aggregation == "seq-mean-token-mean"
    out, grad = loss_and_grad(inp, cfg)
    assert out.loss.item() == pytest.approx((-s0 - 1.2) / 2)
    # d/d log pi_t of -A s0 averaged over 3 tokens and 2 sequences: -A s0 / (3 * 2) per token.
    assert torch.allclose(grad[0], torch.full((3,), -s0 / 6, dtype=DT))
    assert torch.all(grad[1] == 0)
    assert out.metrics["clip_fraction"] == pytest.approx(2 / 5)


def test_gspo_gradient_is_advantage_times_grad_of_sequence_ratio():
    # GSPO's gradient is A_i * grad s_i with s_i = exp(mean_t log r_t); check against autograd on s_i.
    torch.manual_seed(0)
    old = -torch.rand(2, 4, dtype=DT)
    logp = (old + 0.01 * torch.randn(2, 4, dtype=DT)).requires_grad_(True)
    adv = T([[0.7] * 4, [-1.3] * 4])
    mask = T([[1, 1, 1, 0], [1, 1, 1, 1]])
    cfg = AlgorithmConfig(loss="gspo", gspo_eps_low=0.5, gspo_eps_high=0.5)
    out = compute_policy_loss(
        PolicyLossInputs(logprobs=logp, old_logprobs=old, advantages=adv, mask=mask), cfg
    )
    (grad,) = torch.autograd.grad(out.loss, logp)
    s = torch.exp(((logp - old) * mask).sum(-1) / mask.sum(-1))
    (expected,) = torch.autograd.grad(-(adv[:, 0] * s).mean(), logp)
    assert torch.allclose(grad, expected)


# ----------------------------------------------------------------------------- decoupled PPO


@pytest.mark.parametrize(
    ("cap", "mode", "weight"), [(None, "truncate", 2.0), (1.5, "truncate", 1.5), (1.5, "mask", 0.0)]
)
def test_decoupled_ppo_behaviour_weight(cap, mode, weight):
    # pi_old / mu = 2 on every token, r = 1, A = 1: the PPO token loss is -1, times sg(w).
    old = [[math.log(0.5)] * 2]
    inp = inputs_from_ratios(
        [[1.0, 1.0]], [[1.0, 1.0]], old=old, behaviour_logprobs=T([[math.log(0.25)] * 2])
    )
    cfg = AlgorithmConfig(
        loss="decoupled_ppo", decoupled_behaviour_cap=cap, decoupled_cap_mode=mode
    )
    out, grad = loss_and_grad(inp, cfg)
    assert out.loss.item() == pytest.approx(-weight)
    assert torch.allclose(grad, torch.full_like(grad, -weight / 2))


def test_decoupled_ppo_clips_on_the_proximal_ratio():
    # r = pi_theta/pi_old = 1.5 > 1.2 with A = 1: clipped, no gradient, however stale mu is.
    inp = inputs_from_ratios([[1.5]], [[1.0]], behaviour_logprobs=T([[math.log(0.1)]]))
    out, grad = loss_and_grad(inp, AlgorithmConfig(loss="decoupled_ppo"))
    assert out.loss.item() == pytest.approx(-5.0 * 1.2)  # w = 0.5 / 0.1 = 5
    assert grad.item() == 0.0


# ----------------------------------------------------------------------------- TIS, CISPO, TOPR, REINFORCE


def test_cispo_detached_clipped_weight_gradient():
    # eps 0.1/0.1: r = [0.5, 1.05, 1.5] -> w = [0.9, 1.05, 1.1]; A = 1; grad = -sg(w) A / 3.
    inp = inputs_from_ratios([[0.5, 1.05, 1.5]], [[1.0, 1.0, 1.0]])
    out, grad = loss_and_grad(inp, AlgorithmConfig(loss="cispo"))
    assert torch.allclose(grad, T([[-0.9, -1.05, -1.1]]) / 3)
    # Unlike PPO, the clipped r = 1.5 token still has a gradient.
    _, ppo_grad = loss_and_grad(
        inputs_from_ratios([[0.5, 1.05, 1.5]], [[1.0, 1.0, 1.0]]), AlgorithmConfig(loss="ppo")
    )
    assert ppo_grad[0, 2] == 0 and grad[0, 2] != 0


def test_cispo_mask_drops_trust_region_violations():
    # Masked: (A>0, r>1.1) -> token 2; (A<0, r<0.9) -> token 3. Kept: token 0 (A>0, r<0.9), token 1.
    inp = inputs_from_ratios([[0.5, 1.05, 1.5, 0.5]], [[1.0, 1.0, 1.0, -1.0]])
    out, grad = loss_and_grad(inp, AlgorithmConfig(loss="cispo", cispo_mask=True))
    assert torch.allclose(grad, T([[-0.9, -1.05, 0.0, 0.0]]) / 4)
    assert out.metrics["cispo_masked_fraction"] == pytest.approx(0.5)


def test_topr_needs_sequence_rewards():
    with pytest.raises(ValueError, match="sequence_rewards"):
        compute_policy_loss(inputs_from_ratios([[1.0]], [[1.0]]), AlgorithmConfig(loss="topr"))


def test_reinforce_value():
    inp = inputs_from_ratios([[1.0, 1.0]], [[2.0, -1.0]])
    out, grad = loss_and_grad(inp, AlgorithmConfig(loss="reinforce"))
    logp = math.log(0.5)
    assert out.loss.item() == pytest.approx((-2.0 * logp + 1.0 * logp) / 2)
    assert torch.allclose(grad, T([[-2.0, 1.0]]) / 2)


# ----------------------------------------------------------------------------- mismatch correction


@pytest.mark.parametrize(
    ("mismatch", "weights"),
    [
        ({"mode": "none"}, [1.0, 1.0]),
        ({"mode": "token", "cap": 2.0}, [2.0, 0.5]),  # rho = [3, 0.5], min(rho, 2)
        ({"mode": "sequence"}, [1.5**0.5] * 2),  # geometric mean of 3 and 0.5
        ({"mode": "sequence", "sequence_ratio": "product", "cap": 2.0}, [1.5, 1.5]),
        ({"mode": "sequence", "sequence_ratio": "product", "cap": 1.2}, [1.2, 1.2]),
        ({"mode": "mask", "low": 0.4, "high": 2.0}, [0.0, 1.0]),  # 3 rejected, 0.5 kept
        ({"mode": "sequence_mask", "low": 0.5, "high": 1.2}, [0.0, 0.0]),  # sqrt(1.5) > 1.2
    ],
)
def test_mismatch_weights_multiply_the_token_loss(mismatch, weights):
    # REINFORCE token loss -A log pi with A = 1; gradient = -w / N, w detached.
    old = [[math.log(0.6), math.log(0.2)]]
    behaviour = T([[math.log(0.2), math.log(0.4)]])  # rho = pi_old/mu = [3, 0.5]
    inp = inputs_from_ratios([[1.0, 1.0]], [[1.0, 1.0]], old=old, behaviour_logprobs=behaviour)
    out, grad = loss_and_grad(inp, AlgorithmConfig(loss="reinforce", mismatch=mismatch))
    assert torch.allclose(grad, -T([weights]) / 2)
    assert out.metrics["mismatch_masked_fraction"] == pytest.approx(
        sum(w == 0 for w in weights) / 2
    )


def test_mismatch_masked_tokens_stay_in_the_denominator():
    # Token 0 rejected: the loss is the kept token's loss / 2, not / 1.
    old = [[math.log(0.6), math.log(0.2)]]
    inp = inputs_from_ratios(
        [[1.0, 1.0]], [[1.0, 1.0]], old=old, behaviour_logprobs=T([[math.log(0.2)] * 2])
    )
    out = compute_policy_loss(inp, AlgorithmConfig(loss="reinforce", mismatch={"mode": "mask"}))
    assert out.loss.item() == pytest.approx(-math.log(0.2) / 2)


# ----------------------------------------------------------------------------- KL and entropy terms


def test_kl_and_entropy_terms_join_the_loss_when_supplied():
    # r = 1, A = 0 -> policy term 0. pi = 0.5, pi_ref = 0.25: k3 = 0.5 + ln 2 - 1 per token.
    inp = inputs_from_ratios(
        [[1.0, 1.0]], [[0.0, 0.0]], ref_logprobs=T([[math.log(0.25)] * 2]), entropy=T([[0.3, 0.5]])
    )
    cfg = AlgorithmConfig(kl={"coef": 0.1}, entropy_coef=0.01)
    out, grad = loss_and_grad(inp, cfg)
    k3 = 0.5 + math.log(2) - 1
    assert out.loss.item() == pytest.approx(0.1 * k3 - 0.01 * 0.4)
    assert out.metrics["kl_ref"] == pytest.approx(k3) and out.metrics["entropy"] == pytest.approx(
        0.4
    )
    # d k3 / d log pi = 1 - pi_ref / pi = 0.5, times coef, over 2 tokens.
    assert torch.allclose(grad, torch.full_like(grad, 0.1 * 0.5 / 2))
    # kl.mode = "reward": reported, not added.
    cfg = AlgorithmConfig(name="ppo", advantage="gae", kl={"coef": 0.1, "mode": "reward"})
    out = compute_policy_loss(inp, cfg)
    assert out.loss.item() == pytest.approx(0.0) and out.metrics["kl_ref"] == pytest.approx(k3)
