"""AsyPPO pieces: critic data partition, critic loss, aggregation, uncertainty masks, objective."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from cadence.algo.asyppo import (
    CriticConfig,
    aggregate_values,
    asyppo_objective_terms,
    critic_loss,
    explained_variance,
    partition_groups,
    uncertainty_masks,
)

# ---- config -------------------------------------------------------------------


def test_config_defaults_and_validation():
    cfg = CriticConfig()
    assert (cfg.num_critics, cfg.adv_mask_low, cfg.entropy_mask_high, cfg.quantile_scope) == (
        2,
        0.2,
        0.2,
        "batch",
    )
    assert cfg.critic_path is None and cfg.critic_fraction == 0.25
    with pytest.raises(ValidationError):
        CriticConfig(beta=0.1)  # extra="forbid": beta is AlgorithmConfig.entropy_coef
    with pytest.raises(ValidationError, match="<= 1"):
        CriticConfig(adv_mask_low=0.7, entropy_mask_high=0.5)
    with pytest.raises(ValidationError):
        CriticConfig(quantile_scope="micro-batch")


# ---- partition ----------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 10), min_size=1, max_size=8),
    num_critics=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
)
def test_partition_disjoint_covering_uniform(sizes, num_critics, seed):
    gen = torch.Generator().manual_seed(seed)
    # Non-contiguous ids, rows interleaved: partition must not assume sorted groups.
    ids = torch.cat([torch.full((n,), 7 * g + 3) for g, n in enumerate(sizes)])
    ids = ids[torch.randperm(len(ids), generator=gen)]
    assignment = partition_groups(ids, num_critics, gen)

    assert assignment.shape == ids.shape
    assert ((assignment >= 0) & (assignment < num_critics)).all()
    shares = torch.stack([assignment == m for m in range(num_critics)])
    assert (shares.sum(0) == 1).all()  # disjoint and covering: each response in exactly one share
    for g, n in enumerate(sizes):
        counts = torch.bincount(assignment[ids == 7 * g + 3], minlength=num_critics)
        assert counts.sum() == n
        assert counts.max() - counts.min() <= 1
        if n >= num_critics:
            assert (counts > 0).all()  # every critic sees every prompt


def test_partition_is_random_and_reproducible():
    ids = torch.arange(400).repeat_interleave(3)  # 400 groups of 3, 2 critics: one critic gets 2
    a = partition_groups(ids, 2, torch.Generator().manual_seed(0))
    b = partition_groups(ids, 2, torch.Generator().manual_seed(0))
    c = partition_groups(ids, 2, torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and not torch.equal(a, c)
    # The remainder goes to either critic about equally often.
    share0 = (a == 0).sum().item() / len(a)
    assert abs(share0 - 0.5) < 0.05
    # Within a group the shuffled order varies: position 0 is not always critic 0.
    assert 0.35 < (a.view(400, 3)[:, 0] == 0).float().mean().item() < 0.65


def test_partition_empty():
    assert partition_groups(torch.zeros(0, dtype=torch.long), 2).numel() == 0


# ---- critic loss --------------------------------------------------------------


def test_critic_loss_hand_computed():
    values = torch.tensor([[1.0, 2.0, 3.0]])
    returns = torch.tensor([[0.0, 2.0, 5.0]])
    mask = torch.tensor([[1, 1, 0]])
    # 0.5 * ((1-0)^2 + (2-2)^2) / 2
    assert critic_loss(values, returns, mask).item() == pytest.approx(0.25)
    # Clipped around old = 0 with c = 0.5: v_clip = [0.5, 0.5]
    # token 1: max(1, 0.25) = 1; token 2: max(0, (0.5-2)^2 = 2.25) = 2.25
    old = torch.zeros(1, 3)
    assert critic_loss(values, returns, mask, old, value_clip=0.5).item() == pytest.approx(
        0.5 * 3.25 / 2
    )
    with pytest.raises(ValueError):
        critic_loss(values, returns, mask, value_clip=0.5)


def test_critic_loss_ignores_nan_padding_in_value_and_grad():
    values = torch.tensor([[1.0, 2.0]], requires_grad=True)
    returns = torch.tensor([[0.0, math.nan]])
    loss = critic_loss(values, returns, torch.tensor([[1, 0]]))
    loss.backward()
    assert loss.item() == pytest.approx(0.5)
    assert values.grad.tolist() == [[1.0, 0.0]]


def test_critic_loss_empty_mask_is_zero():
    values = torch.ones(2, 3, requires_grad=True)
    loss = critic_loss(values, torch.zeros(2, 3), torch.zeros(2, 3))
    assert loss.item() == 0.0 and loss.requires_grad


def test_each_critic_trains_only_on_its_own_share_of_the_groups():
    """CriticEnsemble.update is the critic loss the trainer runs: the sum over critics of
    `critic_loss` on each critic's own rows. Changing the returns of critic 1's rows must move
    critic 1 and leave critic 0 exactly where it would have been."""
    import copy

    from cadence.algo.asyppo import CriticConfig
    from cadence.models.tiny import tiny_model
    from cadence.train.batch import collate, flatten
    from cadence.train.critics import CriticEnsemble
    from tests.test_trainer import make_groups

    torch.manual_seed(0)
    policy = tiny_model(hidden_size=32, layers=1, heads=2)
    ensemble = CriticEnsemble(CriticConfig(num_critics=2, critic_fraction=0.5), policy, "", 0, 4)
    batch = collate(flatten(make_groups()), pad_id=0)
    assignment = partition_groups(
        batch.group_ids, 2, torch.Generator().set_state(ensemble.generator.get_state())
    )
    returns = torch.randn(batch.mask.shape)
    changed = returns.clone()
    changed[assignment == 1] += 5.0
    old_values = ensemble.values(batch)
    runs = []
    for target in (returns, changed):
        twin = copy.deepcopy(ensemble)
        twin.update(batch, target, old_values)
        runs.append([torch.cat([p.flatten() for p in c.parameters()]) for c in twin.critics])
    assert torch.equal(runs[0][0], runs[1][0])  # critic 0 never saw critic 1's rows
    assert not torch.allclose(runs[0][1], runs[1][1])


# ---- aggregation --------------------------------------------------------------


def test_aggregate_values_mean_and_population_std():
    values = torch.tensor([[[1.0, 0.0]], [[3.0, 0.0]]])  # [M=2, B=1, T=2]
    mean, std = aggregate_values(values)
    assert mean.tolist() == [[2.0, 0.0]] and std.tolist() == [[1.0, 0.0]]
    mean1, std1 = aggregate_values(values[:1])  # one critic: sigma = 0, not NaN
    assert torch.equal(mean1, values[0]) and (std1 == 0).all()


# ---- uncertainty masks --------------------------------------------------------


def _distinct_sigma(b: int, t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct sigmas (a permutation) and a random mask with >= 1 valid token per row."""
    gen = torch.Generator().manual_seed(seed)
    sigma = torch.randperm(b * t, generator=gen).float().view(b, t) / (b * t)
    mask = torch.rand(b, t, generator=gen) < 0.7
    mask[:, 0] = True
    return sigma, mask


@settings(max_examples=100, deadline=None)
@given(
    b=st.integers(1, 6),
    t=st.integers(1, 40),
    k=st.floats(0, 0.5),
    h=st.floats(0, 0.5),
    seed=st.integers(0, 2**31 - 1),
)
def test_mask_fractions_batch_scope(b, t, k, h, seed):
    sigma, mask = _distinct_sigma(b, t, seed)
    adv, ent = uncertainty_masks(sigma, mask, k, h, "batch")
    n = int(mask.sum())
    assert int((mask & (adv == 0)).sum()) == math.floor(k * n + 1e-6)
    assert int((mask & (ent == 0)).sum()) == math.floor(h * n + 1e-6)
    assert (adv[~mask] == 0).all() and (ent[~mask] == 0).all()  # padding never included
    # The masked tokens are the extremes: every dropped sigma beats every kept one.
    low, kept = sigma[mask & (adv == 0)], sigma[mask & (adv == 1)]
    if low.numel() and kept.numel():
        assert low.max() < kept.min()
    high, kept = sigma[mask & (ent == 0)], sigma[mask & (ent == 1)]
    if high.numel() and kept.numel():
        assert high.min() > kept.max()


@settings(max_examples=100, deadline=None)
@given(
    b=st.integers(1, 6),
    t=st.integers(1, 40),
    k=st.floats(0, 0.5),
    h=st.floats(0, 0.5),
    seed=st.integers(0, 2**31 - 1),
)
def test_mask_fractions_sequence_scope(b, t, k, h, seed):
    sigma, mask = _distinct_sigma(b, t, seed)
    adv, ent = uncertainty_masks(sigma, mask, k, h, "sequence")
    for i in range(b):
        n, row = int(mask[i].sum()), mask[i]
        assert int((row & (adv[i] == 0)).sum()) == math.floor(k * n + 1e-6)
        assert int((row & (ent[i] == 0)).sum()) == math.floor(h * n + 1e-6)
        low, kept = sigma[i][row & (adv[i] == 0)], sigma[i][row & (adv[i] == 1)]
        if low.numel() and kept.numel():
            assert low.max() < kept.min()


def test_mask_fraction_on_a_large_batch_is_k_and_h():
    torch.manual_seed(0)
    sigma, mask = torch.rand(16, 256), torch.rand(16, 256) < 0.8
    for scope in ("batch", "sequence"):
        adv, ent = uncertainty_masks(sigma, mask, 0.2, 0.2, scope)
        assert (1 - adv[mask]).mean().item() == pytest.approx(0.2, abs=0.01)
        assert (1 - ent[mask]).mean().item() == pytest.approx(0.2, abs=0.01)


def test_masks_ties_and_tiny_counts():
    mask = torch.ones(2, 10, dtype=torch.bool)
    # Identical critics: sigma all equal -> nothing is masked (plain PPO).
    adv, ent = uncertainty_masks(torch.zeros(2, 10), mask, 0.2, 0.2)
    assert (adv == 1).all() and (ent == 1).all()
    # A tie at the cut keeps all tied tokens: 2 to mask, but values 0,1,1,1... -> only the 0.
    sigma = torch.tensor([[0.0] + [1.0] * 9, [1.0] * 10])
    adv, _ = uncertainty_masks(sigma, mask, 0.2, 0.0)
    assert int((adv == 0).sum()) == 1 and adv[0, 0] == 0
    # Four tokens per sequence, k = 0.2: floor(0.8) = 0 -> none masked in sequence scope.
    adv, ent = uncertainty_masks(torch.rand(3, 4), torch.ones(3, 4), 0.2, 0.2, "sequence")
    assert (adv == 1).all() and (ent == 1).all()
    # Fully padded rows are fine and stay 0.
    adv, ent = uncertainty_masks(
        torch.rand(2, 5), torch.tensor([[1] * 5, [0] * 5]), 0.2, 0.2, "sequence"
    )
    assert (adv[1] == 0).all() and (ent[1] == 0).all() and int((adv[0] == 0).sum()) == 1
    # Deterministic: same input, same masks.
    s = torch.rand(4, 9)
    assert all(
        torch.equal(x, y)
        for x, y in zip(
            uncertainty_masks(s, torch.ones(4, 9)),
            uncertainty_masks(s, torch.ones(4, 9)),
            strict=True,
        )
    )


def test_masks_do_not_track_gradient():
    sigma = torch.rand(2, 6, requires_grad=True)
    adv, ent = uncertainty_masks(sigma, torch.ones(2, 6))
    assert not adv.requires_grad and not ent.requires_grad


# ---- objective: masks act on what reaches the gradient ------------------------


def test_masked_tokens_contribute_zero_gradient():
    torch.manual_seed(0)
    b, t, beta = 3, 7, 0.05
    pg = torch.randn(b, t, requires_grad=True)
    entropy = torch.rand(b, t, requires_grad=True)
    mask = torch.ones(b, t)
    mask[0, -2:] = 0
    adv_mask, ent_mask = uncertainty_masks(torch.rand(b, t), mask, 0.3, 0.3)
    per_token = asyppo_objective_terms(pg, entropy, adv_mask, ent_mask, mask, beta)
    (per_token.sum(-1) / mask.sum(-1)).mean().backward()  # E[1/|o| sum_t ...]

    pg_on, ent_on = (adv_mask * mask).bool(), (ent_mask * mask).bool()
    assert (pg.grad[~pg_on] == 0).all() and (pg.grad[pg_on] != 0).all()
    assert (entropy.grad[~ent_on] == 0).all() and (entropy.grad[ent_on] != 0).all()
    # Loss form: d loss / d H = -beta / (|o| * B) on kept tokens.
    expected = -beta / (mask.sum(-1, keepdim=True) * b)
    assert torch.allclose(entropy.grad[ent_on], expected.expand(b, t)[ent_on])


def test_masked_term_may_be_non_finite():
    pg = torch.tensor([[1.0, math.inf]])
    out = asyppo_objective_terms(
        pg, torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]), torch.ones(1, 2), torch.ones(1, 2), 0.1
    )
    assert out.sum().item() == 1.0


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits, -1)
    return -(logp.exp() * logp).sum(-1)


def test_entropy_mask_changes_the_logits_gradient():
    torch.manual_seed(0)
    b, t, v, beta = 2, 6, 11, 0.1
    logits = torch.randn(b, t, v, requires_grad=True)
    mask, adv_mask = torch.ones(b, t), torch.ones(b, t)
    pg = torch.zeros(b, t)  # isolate the entropy term

    def logits_grad(entropy_mask: torch.Tensor) -> torch.Tensor:
        logits.grad = None
        asyppo_objective_terms(
            pg, _entropy(logits), adv_mask, entropy_mask, mask, beta
        ).sum().backward()
        return logits.grad.clone()

    all_on = logits_grad(torch.ones(b, t))
    some_off = torch.ones(b, t)
    some_off[0, 2] = some_off[1, 4] = 0
    filtered = logits_grad(some_off)
    assert not torch.allclose(all_on, filtered)
    off = some_off == 0
    assert (filtered[off] == 0).all()  # no entropy push on high-disagreement tokens
    assert torch.equal(filtered[~off], all_on[~off])  # other tokens untouched


# ---- explained variance -------------------------------------------------------


def test_explained_variance_hand_computed():
    values = torch.tensor([[1.0, 2.0, 3.0, 4.0, 100.0]])
    returns = torch.tensor([[1.0, 2.0, 3.0, 5.0, -7.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    # Var[R] = 2.1875, Var[R - V] = Var[0, 0, 0, 1] = 0.1875 -> 1 - 0.1875/2.1875
    assert explained_variance(values, returns, mask) == pytest.approx(1 - 0.1875 / 2.1875)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    mean_pred = torch.full_like(returns, returns[mask.bool()].mean().item())
    assert explained_variance(mean_pred, returns, mask) == pytest.approx(0.0, abs=1e-12)
    assert math.isnan(explained_variance(values, torch.ones(1, 5), mask))
    assert math.isnan(explained_variance(values, returns, torch.zeros(1, 5)))
