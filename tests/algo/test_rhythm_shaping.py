"""Rhythm gammas applied to advantages, and the logged credit metrics (hand-computed values)."""

from __future__ import annotations

import pytest
import torch

from cadence.algo.rhythm_shaping import credit_metrics, shape_advantages


def test_shape_advantages_signs_mask_and_detach() -> None:
    adv = torch.tensor([[1.0, -2.0, 3.0, 0.5], [-1.0, 2.0, -3.0, 4.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]])
    gam = torch.tensor([[1.5, 1.5, 1.0, 1.5], [1.5, 1.5, 1.5, 1.0]], requires_grad=True)
    both = shape_advantages(adv, gam, mask)
    assert both.tolist() == [[1.5, -3.0, 3.0, 0.5], [-1.0, 3.0, -4.5, 4.0]]
    pos = shape_advantages(adv, gam, mask, both_signs=False)
    assert pos.tolist() == [[1.5, -2.0, 3.0, 0.5], [-1.0, 3.0, -3.0, 4.0]]
    pos.sum().backward()
    assert gam.grad is None  # weights are detached

    # Per-sample gamma vectors fill the mask positions in order.
    ragged = [torch.tensor([2.0, 1.0, 1.5]), torch.tensor([1.0, 2.0, 1.0])]
    out = shape_advantages(adv.detach(), ragged, mask)
    assert out.tolist() == [[2.0, -2.0, 4.5, 0.5], [-1.0, 2.0, -6.0, 4.0]]
    with pytest.raises(ValueError):
        shape_advantages(adv.detach(), [torch.ones(2), torch.ones(3)], mask)


def test_credit_metrics() -> None:
    gam = torch.tensor([[1.5, 1.0, 9.0], [1.0, 1.25, 1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    m = credit_metrics(gam, mask)
    assert m["rhythm/amplified_frac"] == pytest.approx(0.4)
    assert m["rhythm/gamma_mean"] == pytest.approx(5.75 / 5)
    m = credit_metrics([torch.tensor([1.5, 1.0]), torch.tensor([1.0])])
    assert m["rhythm/amplified_frac"] == pytest.approx(1 / 3)
    assert credit_metrics([])["rhythm/gamma_mean"] == 1.0
