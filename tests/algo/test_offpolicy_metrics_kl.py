"""offpolicy/* metrics, the KL estimators' gradients, adaptive KL and whitened GAE: hand-computed."""

from __future__ import annotations

import math

import pytest
import torch

from cadence.algo.advantages import compute_advantages
from cadence.algo.config import AlgorithmConfig, KLConfig
from cadence.algo.kl import AdaptiveKLController, kl_estimate, kl_loss
from cadence.algo.offpolicy_metrics import normalised_ess, offpolicy_metrics
from tests.algo.loss_helpers import T


def test_offpolicy_metrics_by_hand():
    # rho = pi_old/mu = [[1, 2], [1, 4]] (+ a padding token with a huge ratio, ignored)
    # token ESS: (1+2+1+4)^2 / (4 (1+4+1+16)) = 64/88; sequences: w = [2, 4] -> 36 / (2 * 20) = 0.9
    # KL(mu || pi_old) k3: mean(rho - 1 - log rho) = ((1 - ln 2) + (3 - ln 4)) / 4
    log_rho = T([[0.0, math.log(2), 50.0], [0.0, math.log(4), 0.0]])
    mask = T([[1, 1, 0], [1, 1, 0]])
    keep = T([[1, 1, 1], [0, 1, 1]])  # one response token rejected
    weight = T([[1, 2, 1], [1, 2, 1]])  # the 4 truncated at 2
    m = offpolicy_metrics(log_rho * mask, weight, keep, mask)
    assert m["offpolicy/ess"] == pytest.approx(64 / 88)
    assert m["offpolicy/ess_seq"] == pytest.approx(0.9)
    assert m["offpolicy/kl_mu_pi_old"] == pytest.approx((1 - math.log(2) + 3 - math.log(4)) / 4)
    assert m["offpolicy/masked_frac"] == pytest.approx(0.25)
    assert m["offpolicy/truncated_frac"] == pytest.approx(0.25)


def test_ess_extremes_and_no_overflow():
    assert normalised_ess(T([0.3] * 5)) == pytest.approx(1.0)
    assert normalised_ess(T([0.0, 0.0, 0.0, 800.0])) == pytest.approx(0.25)  # one weight holds all
    assert normalised_ess(T([])) == 1.0
    equal = torch.full((1000,), 0.1234, dtype=torch.float32)  # float32 rounding must not exceed 1
    assert normalised_ess(equal) <= 1.0


def test_policy_loss_reports_offpolicy_metrics_under_their_names():
    from cadence.algo.losses import PolicyLossInputs
    from cadence.algo.policy_loss import compute_policy_loss

    logp = T([[math.log(0.5), math.log(0.5)]]).requires_grad_(True)
    inp = PolicyLossInputs(logprobs=logp, old_logprobs=logp.detach(), advantages=T([[1.0, 1.0]]),
                           mask=T([[1, 1]]), behaviour_logprobs=T([[math.log(0.25), math.log(0.5)]]))
    m = compute_policy_loss(inp, AlgorithmConfig()).metrics
    assert m["offpolicy/ess"] == pytest.approx(9 / 10)  # rho = [2, 1]
    assert m["offpolicy/truncated_frac"] == 0.0  # default token weight min(rho, 2): 2 is not truncated


def _categorical_gradients(estimator: str):
    """Exact E_{y ~ pi}[grad k(y)] over a 3-token vocabulary, and the two true KL gradients."""
    theta = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.tensor([0.0, 0.4, -0.3], dtype=torch.float64), 0)

    def grad(objective) -> torch.Tensor:
        return torch.autograd.grad(objective(torch.log_softmax(theta, 0)), theta)[0]

    pi = torch.softmax(theta, 0).detach()  # sampling probabilities: not differentiated
    expected = grad(lambda logp: (pi * kl_estimate(logp, ref, estimator)).sum())
    reverse = grad(lambda logp: (logp.exp() * (logp - ref)).sum())  # KL(pi || ref)
    forward = grad(lambda logp: (ref.exp() * (ref - logp)).sum())  # KL(ref || pi)
    return expected, reverse, forward


def test_k2_and_k2_grad_give_the_reverse_kl_gradient_k3_the_forward_one_k1_none():
    for estimator in ("k2", "k2_grad"):
        expected, reverse, _ = _categorical_gradients(estimator)
        assert torch.allclose(expected, reverse)
    expected, reverse, forward = _categorical_gradients("k3")
    assert torch.allclose(expected, forward) and not torch.allclose(expected, reverse)
    expected, _, _ = _categorical_gradients("k1")
    assert torch.allclose(expected, torch.zeros(3, dtype=torch.float64))


def test_k2_grad_reports_k3s_value():
    logp, ref = T([[math.log(0.5)]]), T([[math.log(0.25)]])
    d = -math.log(2)
    cfg = KLConfig(coef=0.1, estimator="k2_grad")
    assert kl_loss(logp, ref, T([[1.0]]), cfg, "token-mean").item() == pytest.approx(math.exp(d) - d - 1)


def test_adaptive_kl_controller_by_hand():
    ctl = AdaptiveKLController(coef=0.1, target=6.0, horizon=10000)
    assert ctl.update(kl=9.0, n=64) == pytest.approx(0.1 * (1 + 0.2 * 64 / 10000))  # error 0.5 clipped to 0.2
    ctl = AdaptiveKLController(coef=0.1, target=6.0, horizon=10000)
    assert ctl.update(kl=5.4, n=100) == pytest.approx(0.1 * (1 - 0.1 * 100 / 10000))  # error -0.1


def test_whitened_gae_has_zero_mean_unit_std_and_the_same_returns():
    rewards, groups, mask = T([1.0, 0.0]), torch.tensor([0, 0]), T([[1, 1, 0], [1, 1, 1]])
    values = T([[0.2, 0.5, 0.0], [0.1, 0.3, 0.4]])
    plain = compute_advantages(AlgorithmConfig(name="ppo"), rewards, groups, mask, values=values)
    white = compute_advantages(AlgorithmConfig(name="ppo", whiten_advantages=True), rewards, groups, mask, values=values)
    a = white.advantages[mask > 0]
    assert a.mean().item() == pytest.approx(0.0, abs=1e-9) and a.std().item() == pytest.approx(1.0, abs=1e-5)
    assert torch.equal(white.returns, plain.returns) and white.advantages[0, 2] == 0.0
    raw = plain.advantages[mask > 0]
    assert torch.allclose(a, (raw - raw.mean()) / (raw.std() + 1e-6))
