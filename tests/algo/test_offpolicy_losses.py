"""Each loss takes its ratio against the policy its paper names: hand-computed, mu != pi_old != pi_theta.

Every case sets three different probabilities per token: pi_theta (trained,
carries gradient), pi_old (the proximal policy the trainer recomputed) and mu
(the engine's behaviour policy, alpha versions stale). Swapping any two of them
in a loss changes the expected gradient below, so a loss that takes the wrong
ratio fails. Gradients are d loss / d log pi_theta(y_t).
"""

from __future__ import annotations

import math

import pytest
import torch

from cadence.algo.config import AlgorithmConfig
from cadence.algo.policy_loss import compute_policy_loss
from tests.algo.loss_helpers import T, inputs_from_probs, loss_and_grad

probs = inputs_from_probs


def test_tis_weights_by_pi_old_over_mu_truncated_at_c():
    # pi_old = 0.5; pi_theta = [0.75, 0.4]; mu = [0.2, 0.4]
    # w = pi_old / mu = [2.5, 1.25] -> min(w, 2) = [2, 1.25]; A = [1, -2]
    # loss = mean(-w A log pi_theta), grad = -w A / 2 = [-1, 1.25]
    # (pi_theta/mu would give [2, 1] -> grad [-1, 1]; pi_theta/pi_old [1.5, 0.8] -> [-0.75, 0.8])
    inp = probs([[0.75, 0.4]], [[0.5, 0.5]], [[0.2, 0.4]], [[1.0, -2.0]])
    out, grad = loss_and_grad(inp, AlgorithmConfig(loss="tis"))
    assert torch.allclose(grad, T([[-1.0, 1.25]]))
    expected = (-2.0 * 1.0 * math.log(0.75) - 1.25 * -2.0 * math.log(0.4)) / 2
    assert out.loss.item() == pytest.approx(expected)
    assert out.metrics["clip_fraction"] == pytest.approx(0.5)  # the 2.5 was truncated
    # With C = 1: min([2.5, 1.25], 1) = [1, 1] (not ROLL's tis, whose ratio is against pi_old, not mu).
    _, grad = loss_and_grad(inp, AlgorithmConfig(loss="tis", tis_cap=1.0))
    assert torch.allclose(grad, T([[-0.5, 1.0]]))


def test_cispo_weights_by_pi_theta_over_mu_clipped():
    # pi_old = 0.5; pi_theta = [0.6, 0.25, 0.5]; mu = [0.5, 0.25, 0.6]
    # w = pi_theta / mu = [1.2, 1.0, 0.833] -> clip to [0.9, 1.1] = [1.1, 1.0, 0.9]; A = 1
    # (pi_theta/pi_old = [1.2, 0.5, 1] would give [1.1, 0.9, 1.0]; pi_old/mu [1, 2, 0.83] [1, 1.1, 0.9])
    inp = probs([[0.6, 0.25, 0.5]], [[0.5] * 3], [[0.5, 0.25, 0.6]], [[1.0] * 3])
    out, grad = loss_and_grad(inp, AlgorithmConfig(loss="cispo"))
    assert torch.allclose(grad, T([[-1.1, -1.0, -0.9]]) / 3)
    assert out.metrics["clip_fraction"] == pytest.approx(2 / 3)
    # The optional mask drops A > 0 tokens whose w > 1 + eps_high: token 0 (w = 1.2).
    _, grad = loss_and_grad(inp, AlgorithmConfig(loss="cispo", cispo_mask=True))
    assert torch.allclose(grad, T([[0.0, -1.0, -0.9]]) / 3)


def test_topr_tapers_negative_sequences_by_one_sequence_weight():
    # seq 0: reward 1 (positive): weight 1 whatever the ratios.
    # seq 1: reward 0: pi_theta(y)/mu(y) = (0.25 * 0.6) / (0.5 * 0.4) = 0.75 -> weight 0.75 on both
    #        tokens (per-token ratios 0.5 and 1.5 would give [0.5, 1]).
    # seq 2: reward 0: (0.5 * 0.5) / (0.25 * 0.5) = 2 -> min(1, 2) = 1.
    # seq-mean-token-sum over B = 3 sequences: grad = -w A / 3.
    pi_theta = [[0.25, 0.6], [0.25, 0.6], [0.5, 0.5]]
    pi_old = [[0.5, 0.5]] * 3
    mu = [[0.9, 0.9], [0.5, 0.4], [0.25, 0.5]]
    adv = [[0.5, 0.5], [-0.5, -0.5], [-1.0, -1.0]]
    inp = probs(pi_theta, pi_old, mu, adv, rewards=[1.0, 0.0, 0.0])
    cfg = AlgorithmConfig(loss="topr")
    assert cfg.aggregation == "seq-mean-token-sum"  # the paper's sum over a sequence's tokens
    out, grad = loss_and_grad(inp, cfg)
    expected = T([[-0.5, -0.5], [0.375, 0.375], [1.0, 1.0]]) / 3
    assert torch.allclose(grad, expected)
    assert out.metrics["positive_fraction"] == pytest.approx(1 / 3)


def test_topr_reward_threshold_moves_the_split():
    inp = probs([[0.25, 0.6]], [[0.5, 0.5]], [[0.5, 0.4]], [[1.0, 1.0]], rewards=[1.0])
    _, grad = loss_and_grad(inp, AlgorithmConfig(loss="topr"))
    assert torch.allclose(grad, T([[-1.0, -1.0]]))  # positive: no IS weight
    _, grad = loss_and_grad(inp, AlgorithmConfig(loss="topr", topr_reward_threshold=1.0))
    assert torch.allclose(grad, T([[-0.75, -0.75]]))  # not positive any more: tapered by 0.75


def test_decoupled_ppo_clips_pi_theta_over_pi_old_and_weights_by_pi_old_over_mu():
    # pi_old = 0.5; pi_theta = [0.55, 0.75] (r = [1.1, 1.5]); mu = [0.4, 0.25] (w = [1.25, 2])
    # token 0: inside the clip, grad = -w r A / 2 = -1.25 * 1.1 / 2; token 1: clipped, grad 0.
    inp = probs([[0.55, 0.75]], [[0.5, 0.5]], [[0.4, 0.25]], [[1.0, 1.0]])
    out, grad = loss_and_grad(inp, AlgorithmConfig(loss="decoupled_ppo"))
    assert torch.allclose(grad, T([[-1.25 * 1.1 / 2, 0.0]]))
    assert out.loss.item() == pytest.approx(-(1.25 * 1.1 + 2.0 * 1.2) / 2)


@pytest.mark.parametrize("loss", ["ppo", "grpo"])
def test_ppo_and_grpo_clip_against_pi_old_with_the_default_mu_correction(loss):
    # Same numbers as decoupled PPO, mu = [0.4, 0.1]: w = pi_old/mu = [1.25, 5] truncated at 2.
    # token 0: grad -1.25 * 1.1 / 2; token 1: clipped (r = 1.5 > 1.2), grad 0, loss -2 * 1.2.
    inp = probs([[0.55, 0.75]], [[0.5, 0.5]], [[0.4, 0.1]], [[1.0, 1.0]])
    cfg = AlgorithmConfig(loss=loss)
    assert cfg.mismatch.mode == "token" and not cfg.ignores_staleness
    out, grad = loss_and_grad(inp, cfg)
    assert torch.allclose(grad, T([[-1.25 * 1.1 / 2, 0.0]]))
    assert out.loss.item() == pytest.approx(-(1.25 * 1.1 + 2.0 * 1.2) / 2)
    # Without the correction the same loss ignores mu entirely: grad -r A / 2.
    off = AlgorithmConfig(loss=loss, mismatch={"mode": "none"})
    assert off.ignores_staleness
    _, grad = loss_and_grad(inp, off)
    assert torch.allclose(grad, T([[-1.1 / 2, 0.0]]))


def test_dr_grpo_divides_by_the_constant_length_with_the_mu_correction():
    # r = [1.1, 0.9] inside the clip; w = pi_old/mu = [1.25, 0.5]; A = 1; L = 4:
    # loss = -(w0 r0 + w1 r1) / 4, grad = -w r A / 4.
    inp = probs([[0.55, 0.45]], [[0.5, 0.5]], [[0.4, 1.0]], [[1.0, 1.0]])
    out, grad = loss_and_grad(inp, AlgorithmConfig(loss="dr_grpo", max_response_length=4))
    assert torch.allclose(grad, T([[-1.25 * 1.1 / 4, -0.5 * 0.9 / 4]]))
    assert out.loss.item() == pytest.approx(-(1.25 * 1.1 + 0.5 * 0.9) / 4)


def test_gspo_sequence_ratio_against_pi_old_with_the_mu_correction():
    # pi_old = 0.5 on both tokens, r = [1.0001, 1.0003]: s = exp(mean log r) ~ 1.0002, inside
    # GSPO's clip [1 - 3e-4, 1 + 4e-4]. mu = [0.25, 0.5]: w = [2, 1]. A = 1, seq-mean-token-mean:
    # grad_t = -w_t * s * A / 2.
    r = [1.0001, 1.0003]
    inp = probs([[0.5 * r[0], 0.5 * r[1]]], [[0.5, 0.5]], [[0.25, 0.5]], [[1.0, 1.0]])
    _, grad = loss_and_grad(inp, AlgorithmConfig(loss="gspo"))
    s = math.exp((math.log(r[0]) + math.log(r[1])) / 2)
    assert torch.allclose(grad, T([[-2.0 * s / 2, -1.0 * s / 2]]))


def test_reinforce_gets_the_mu_correction_by_default():
    # -A log pi_theta times min(pi_old/mu, 2): pi_old = 0.5, mu = [0.2, 1.0] -> w = [2, 0.5]; A = [2, -1].
    inp = probs([[0.3, 0.6]], [[0.5, 0.5]], [[0.2, 1.0]], [[2.0, -1.0]])
    out, grad = loss_and_grad(inp, AlgorithmConfig(loss="reinforce"))
    assert torch.allclose(grad, T([[-2.0, 0.25]]))
    assert out.loss.item() == pytest.approx((-4.0 * math.log(0.3) + 0.5 * math.log(0.6)) / 2)


@pytest.mark.parametrize("loss", ["tis", "cispo", "topr", "decoupled_ppo"])
def test_losses_weighted_by_mu_get_no_second_weight(loss):
    cfg = AlgorithmConfig(loss=loss)
    assert cfg.mismatch.mode == "none" and not cfg.ignores_staleness
    inp = probs([[0.55, 0.45]], [[0.5, 0.5]], [[0.4, 1.0]], [[1.0, 1.0]], rewards=[0.0])
    out = compute_policy_loss(inp, cfg)
    assert out.metrics["mismatch_weight_mean"] == 1.0
