"""The high-staleness corrections (IcePop, seq_mis, geo_rs, M2PO): hand-computed, mu != pi_old != pi_theta.

Each case sets pi_theta (trained), pi_old (the trainer's proximal policy) and
mu (the engine's behaviour policy) to different values per token, so a
correction that takes its ratio against the wrong policy, or compares the
wrong way, gives another gradient. Gradients are d loss / d log pi_theta(y_t).
"""

from __future__ import annotations

import math

import pytest
import torch

from cadence.algo.config import AlgorithmConfig
from cadence.algo.losses import PolicyLossInputs
from tests.algo.loss_helpers import T, inputs_from_probs, loss_and_grad

probs = inputs_from_probs


def from_log_rho(log_rho, pi_theta, adv, mask=None) -> PolicyLossInputs:
    """pi_old = 0.5 everywhere, mu = pi_old / rho."""
    rho = T(log_rho).exp()
    return probs(pi_theta, torch.full_like(rho, 0.5).tolist(), (0.5 / rho).tolist(), adv, mask)


def test_icepop_weights_by_pi_old_over_mu_inside_its_window_and_drops_the_rest():
    # pi_old = 0.5; mu = [0.4, 0.05, 0.2] -> rho = pi_old/mu = [1.25, 10, 2.5]; window [0.5, 5]
    # -> keep [1, 0, 1], weight [1.25, -, 2.5]. grpo, pi_theta = [0.6, 0.5, 0.45]:
    # r = [1.2, 1.0, 0.9], A = [1, 1, -1], no clip binds: d(-r A)/d log pi = -r A = [-1.2, -1, 0.9]
    # grad = weight * keep * (-r A) / 3 = [-0.5, 0, 0.75]
    # (pi_theta/mu = [1.5, 10, 2.25] would give [-0.6, 0, 0.675]; a one-sided mask keeps token 1)
    inp = probs([[0.6, 0.5, 0.45]], [[0.5] * 3], [[0.4, 0.05, 0.2]], [[1.0, 1.0, -1.0]])
    out, grad = loss_and_grad(inp, AlgorithmConfig(loss="grpo", mismatch={"mode": "icepop"}))
    assert torch.allclose(grad, T([[-0.5, 0.0, 0.75]]))
    assert out.metrics["offpolicy/masked_frac"] == pytest.approx(1 / 3)
    # The lower bound matters too: token 1 has rho = 0.2 / 0.5 = 0.4 < 0.5 and is dropped.
    inp = probs([[0.6, 0.2]], [[0.5, 0.2]], [[0.4, 0.5]], [[1.0, 1.0]])
    _, grad = loss_and_grad(inp, AlgorithmConfig(loss="grpo", mismatch={"mode": "icepop"}))
    assert torch.allclose(grad, T([[-1.25 * 1.2 / 2, 0.0]]))


def test_seq_mis_keeps_a_sequence_with_its_product_weight_only_below_the_cap():
    # pi_old = 0.5; rho seq 0 = [1.25, 1.2] -> product 1.5 <= 2: weight 1.5 on both tokens;
    # rho seq 1 = [2.0, 1.5] -> product 3 > 2: dropped (its geometric mean 1.73 would keep it).
    # reinforce, A = 1: grad = -w keep / 4 = [-0.375, -0.375], [0, 0]
    mu = [[0.4, 0.5 / 1.2], [0.25, 1 / 3]]
    inp = probs([[0.3, 0.7], [0.2, 0.6]], [[0.5, 0.5]] * 2, mu, [[1.0, 1.0]] * 2)
    out, grad = loss_and_grad(inp, AlgorithmConfig(loss="reinforce", mismatch={"mode": "seq_mis"}))
    assert torch.allclose(grad, T([[-0.375, -0.375], [0.0, 0.0]]))
    assert out.metrics["offpolicy/masked_frac"] == pytest.approx(0.5)


def test_geo_rs_rejects_by_geometric_mean_and_vetoes_a_catastrophic_token():
    # log rho rows: [5e-4, -1e-4] (geo mean ratio 1.0002, kept), [0, 0.003] (1.0015 > 1.001, dropped),
    # [-10, 10] (geo mean exactly 1, but rho = e^-10 < veto 1e-4: dropped). No weight: w = 1.
    # reinforce, A = 1, 6 tokens: grad = -keep / 6
    inp = from_log_rho([[5e-4, -1e-4], [0.0, 0.003], [-10.0, 10.0]], [[0.3, 0.6]] * 3, [[1.0, 1.0]] * 3)
    _, grad = loss_and_grad(inp, AlgorithmConfig(loss="reinforce", mismatch={"mode": "geo_rs"}))
    assert torch.allclose(grad, T([[-1 / 6, -1 / 6], [0.0, 0.0], [0.0, 0.0]]))
    # Without the veto the third sequence passes.
    cfg = AlgorithmConfig(loss="reinforce", mismatch={"mode": "geo_rs", "veto": None})
    _, grad = loss_and_grad(inp, cfg)
    assert torch.allclose(grad, T([[-1 / 6, -1 / 6], [0.0, 0.0], [-1 / 6, -1 / 6]]))


def test_m2po_masks_the_fewest_largest_second_moments_that_bring_the_mean_under_tau():
    # log rho = [0.5, 0.4, 0.2, 0.1] -> M2 = [0.25, 0.16, 0.04, 0.01], mean 0.115 > 0.04;
    # drop 0.25: mean(0.16, 0.04, 0.01) = 0.07 > 0.04; drop 0.16: mean(0.04, 0.01) = 0.025: stop.
    # keep = [0, 0, 1, 1]; weight rho; reinforce A = 1: grad = -rho keep / 4
    # (a padding token with a huge stored ratio is outside the mask and counts for nothing)
    log_rho = [[0.5, 0.4, 0.2, 0.1, 9.0]]
    inp = from_log_rho(log_rho, [[0.3, 0.4, 0.6, 0.7, 0.5]], [[1.0] * 5], mask=[[1, 1, 1, 1, 0]])
    out, grad = loss_and_grad(inp, AlgorithmConfig(loss="reinforce", mismatch={"mode": "m2po"}))
    expected = T([[0.0, 0.0, -math.exp(0.2) / 4, -math.exp(0.1) / 4, 0.0]])
    assert torch.allclose(grad, expected)
    assert out.metrics["offpolicy/masked_frac"] == pytest.approx(0.5)
    # A looser tau keeps more: at 0.08, dropping only the 0.25 (mean 0.07) suffices.
    cfg = AlgorithmConfig(loss="reinforce", mismatch={"mode": "m2po", "m2_threshold": 0.08})
    _, grad = loss_and_grad(from_log_rho(log_rho, [[0.3, 0.4, 0.6, 0.7, 0.5]], [[1.0] * 5], mask=[[1, 1, 1, 1, 0]]), cfg)
    assert (grad[0, :4] != 0).tolist() == [False, True, True, True]


def test_m2po_on_fresh_data_keeps_everything():
    inp = from_log_rho([[0.0, 0.0, 0.0]], [[0.3, 0.4, 0.6]], [[1.0, -1.0, 1.0]])
    out, grad = loss_and_grad(inp, AlgorithmConfig(loss="grpo", mismatch={"mode": "m2po"}))
    assert out.metrics["offpolicy/masked_frac"] == 0.0 and torch.all(grad != 0)


@pytest.mark.parametrize(
    ("settings", "fragment"),
    [
        ({"loss": "topr", "mismatch": {"mode": "icepop"}}, "a second time"),
        ({"loss": "tis", "mismatch": {"mode": "seq_mis"}}, "a second time"),
        ({"loss": "decoupled_ppo", "mismatch": {"mode": "m2po"}}, "a second time"),
        ({"loss": "grpo", "mismatch": {"mode": "geo_rs", "sequence_ratio": "product"}}, "geometric"),
        ({"loss": "grpo", "mismatch": {"mode": "m2po"}, "dual_clip": 3.0}, "no clip"),
        ({"loss": "grpo", "mismatch": {"mode": "icepop", "low": 1.2}}, "low <= 1 <= high"),
        ({"loss": "grpo", "mismatch": {"mode": "geo_rs", "veto": 2.0}}, "veto"),
        ({"loss": "grpo", "whiten_advantages": True}, "whiten_advantages"),
        ({"loss": "grpo", "kl": {"target": 6.0}}, "kl.target"),
    ],
)
def test_combinations_the_papers_forbid_fail_at_load(settings, fragment):
    with pytest.raises(ValueError, match=fragment):
        AlgorithmConfig(**settings)


def test_masking_only_geo_rs_composes_with_a_loss_weighted_by_mu():
    assert AlgorithmConfig(loss="topr", mismatch={"mode": "geo_rs"}).mismatch.mode == "geo_rs"


def test_mode_defaults_are_the_papers_and_an_explicit_value_wins():
    assert AlgorithmConfig(mismatch={"mode": "icepop"}).mismatch.high == 5.0
    geo = AlgorithmConfig(mismatch={"mode": "geo_rs"}).mismatch
    assert (geo.low, geo.high, geo.veto) == (0.999, 1.001, 1e-4)
    assert AlgorithmConfig(mismatch={"mode": "seq_mis"}).mismatch.sequence_ratio == "product"
    assert AlgorithmConfig(mismatch={"mode": "icepop", "high": 3.0}).mismatch.high == 3.0


def test_cadence_algorithms_lists_every_mismatch_mode():
    from typing import get_args

    from typer.testing import CliRunner

    from cadence.algo.config import MismatchConfig
    from cadence.cli import app

    modes = get_args(MismatchConfig.model_fields["mode"].annotation)
    listing = CliRunner().invoke(app, ["algorithms"]).output
    for mode in modes:
        assert f"\n  {mode} " in listing, mode
