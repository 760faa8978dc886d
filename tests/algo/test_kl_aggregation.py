"""Aggregation modes (and their micro-batch exactness) and the KL estimators, by hand."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cadence.algo.aggregation import MODES, aggregate, batch_denominators
from cadence.algo.config import KLConfig
from cadence.algo.kl import kl_estimate, kl_loss, kl_reward_penalty, shape_token_rewards

DT = torch.float64


def T(x) -> torch.Tensor:
    return torch.tensor(x, dtype=DT)


# ----------------------------------------------------------------------------- aggregation

PER_TOKEN = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]
MASK = [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]  # lengths 2, 1, 0 (empty row)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (1 + 2 + 4) / 3),  # N = 3 tokens
        ("seq-mean-token-mean", ((1 + 2) / 2 + 4 / 1) / 2),  # S = 2 valid sequences
        ("seq-mean-token-sum", ((1 + 2) + 4) / 2),
        ("seq-mean-token-sum-norm", ((1 + 2) + 4) / (4 * 2)),  # L = 4
    ],
)
def test_aggregate_by_hand(mode, expected):
    out = aggregate(T(PER_TOKEN), T(MASK), mode, norm_length=4)
    assert out.item() == pytest.approx(expected)


def test_explicit_denominators_replace_the_local_counts():
    per_token, mask = T(PER_TOKEN), T(MASK)
    assert aggregate(per_token, mask, "token-mean", token_denominator=10).item() == pytest.approx(
        7 / 10
    )
    assert aggregate(
        per_token, mask, "seq-mean-token-sum", seq_denominator=7
    ).item() == pytest.approx(1.0)
    assert batch_denominators(mask) == (3.0, 2.0)


def test_all_masked_batch_gives_zero_not_nan():
    for mode in MODES:
        out = aggregate(T(PER_TOKEN), torch.zeros(3, 3, dtype=DT), mode, norm_length=4)
        assert out.item() == 0.0


def test_masked_positions_may_hold_inf_or_nan():
    per_token = T([[1.0, math.inf], [math.nan, 2.0]]).requires_grad_(True)
    mask = T([[1.0, 0.0], [0.0, 1.0]])
    out = aggregate(per_token, mask, "token-mean")
    out.backward()
    assert out.item() == pytest.approx(1.5)
    assert torch.equal(per_token.grad, T([[0.5, 0.0], [0.0, 0.5]]))


def test_aggregate_rejects_unknown_mode_and_missing_norm_length():
    with pytest.raises(ValueError, match="valid modes: token-mean"):
        aggregate(T(PER_TOKEN), T(MASK), "mean")
    with pytest.raises(ValueError, match="max_response_length"):
        aggregate(T(PER_TOKEN), T(MASK), "seq-mean-token-sum-norm")


@settings(max_examples=50, deadline=None)
@given(
    mode=st.sampled_from(MODES),
    B=st.integers(1, 8),
    L=st.integers(1, 6),
    micro=st.integers(1, 8),
    seed=st.integers(0, 2**31 - 1),
)
def test_micro_batches_with_batch_denominators_sum_to_the_full_loss(mode, B, L, micro, seed):
    """sum over micro-batches of aggregate(part, N_full, S_full) == aggregate(full), value and gradient."""
    g = torch.Generator().manual_seed(seed)
    per_token = torch.randn(B, L, generator=g, dtype=DT).requires_grad_(True)
    mask = (torch.rand(B, L, generator=g) < 0.6).to(DT)
    full = aggregate(per_token, mask, mode, norm_length=L)
    (full_grad,) = torch.autograd.grad(full, per_token)

    n_tok, n_seq = batch_denominators(mask)
    parts = [
        aggregate(per_token[rows], mask[rows], mode, n_tok, n_seq, norm_length=L)
        for rows in torch.arange(B).split(micro)
    ]
    total = torch.stack(parts).sum()
    (micro_grad,) = torch.autograd.grad(total, per_token)
    assert total.item() == pytest.approx(full.item(), abs=1e-12)
    assert torch.allclose(micro_grad, full_grad, atol=1e-12)


def test_micro_batches_without_batch_denominators_are_not_exact():
    # Why the denominators exist: token-mean per micro-batch, then summed, double counts.
    per_token, mask = T([[1.0, 1.0], [3.0, 0.0]]), T([[1.0, 1.0], [1.0, 0.0]])
    full = aggregate(per_token, mask, "token-mean")  # (1 + 1 + 3) / 3
    naive = aggregate(per_token[:1], mask[:1], "token-mean") + aggregate(
        per_token[1:], mask[1:], "token-mean"
    )
    assert full.item() == pytest.approx(5 / 3) and naive.item() == pytest.approx(4.0)


# ----------------------------------------------------------------------------- KL estimators

LN2 = math.log(2.0)


@pytest.mark.parametrize(
    ("estimator", "expected"),
    [
        # token 0: pi = 0.5, pi_ref = 0.25 -> d = log(pi_ref/pi) = -ln2
        # token 1: pi = 0.25, pi_ref = 0.5 -> d = +ln2
        ("k1", [LN2, -LN2]),  # -d
        ("k2", [0.5 * LN2**2, 0.5 * LN2**2]),  # d^2 / 2
        ("k3", [0.5 + LN2 - 1, 2 - LN2 - 1]),  # e^d - d - 1
    ],
)
def test_kl_estimators_by_hand(estimator, expected):
    logp = T([[math.log(0.5), math.log(0.25)]])
    ref = T([[math.log(0.25), math.log(0.5)]])
    assert torch.allclose(kl_estimate(logp, ref, estimator), T([expected]))


def test_k3_is_unbiased_for_the_true_kl():
    # Sample from pi over 3 outcomes: E_pi[k3] = KL(pi || ref) = sum pi log(pi / ref).
    pi, ref = T([0.5, 0.3, 0.2]), T([0.2, 0.3, 0.5])
    exact = (pi * (pi / ref).log()).sum()
    k3 = kl_estimate(pi.log(), ref.log(), "k3")
    k1 = kl_estimate(pi.log(), ref.log(), "k1")
    assert (pi * k3).sum().item() == pytest.approx(exact.item())
    assert (pi * k1).sum().item() == pytest.approx(exact.item())


def test_k3_gradient_and_clamp():
    # d k3 / d log pi = 1 - pi_ref / pi: 1 - 0.5 = 0.5 at pi = 0.5, pi_ref = 0.25.
    logp = T([math.log(0.5)]).requires_grad_(True)
    kl_estimate(logp, T([math.log(0.25)]), "k3").sum().backward()
    assert logp.grad.item() == pytest.approx(0.5)
    # An extreme log-ratio is clamped instead of overflowing.
    out = kl_estimate(T([-1000.0]), T([0.0]), "k3", max_log_ratio=20.0)
    assert torch.isfinite(out).all() and out.item() == pytest.approx(math.exp(20) - 21)
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_estimate(T([0.0]), T([0.0]), "k4")


def test_kl_loss_aggregates_like_the_policy_term():
    logp = T([[math.log(0.5), math.log(0.5)], [math.log(0.5), 0.0]])
    ref = T([[math.log(0.25)] * 2, [math.log(0.25), 0.0]])
    mask = T([[1.0, 1.0], [1.0, 0.0]])
    k3 = 0.5 + LN2 - 1
    assert kl_loss(logp, ref, mask, KLConfig(), "token-mean").item() == pytest.approx(k3)
    assert kl_loss(logp, ref, mask, KLConfig(), "seq-mean-token-sum").item() == pytest.approx(
        1.5 * k3
    )


def test_kl_reward_shaping():
    # Rewards R = [1, 2] on the last response tokens (index 1 and 2); penalty 0.1 * k1 per token.
    mask = T([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    logp = T([[math.log(0.5)] * 3, [math.log(0.5)] * 3])
    ref = T([[math.log(0.25)] * 3, [math.log(0.5)] * 3])  # row 0: k1 = ln2, row 1: 0
    cfg = KLConfig(coef=0.1, estimator="k1", mode="reward")
    penalty = kl_reward_penalty(logp, ref, mask, cfg)
    assert torch.allclose(penalty, T([[0.1 * LN2, 0.1 * LN2, 0.0], [0.0, 0.0, 0.0]]))
    shaped = shape_token_rewards(T([1.0, 2.0]), mask, logp, ref, cfg)
    assert torch.allclose(shaped, T([[-0.1 * LN2, 1.0 - 0.1 * LN2, 0.0], [0.0, 0.0, 2.0]]))
    assert not penalty.requires_grad
