"""Advantage estimators against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cadence.algo import advantages
from cadence.algo.advantages import (
    compute_advantages,
    discounted_scan,
    group_stats,
    last_token_rewards,
)
from cadence.algo.config import AlgorithmConfig
from cadence.algo.turn_returns import spread_over_turns, turn_index, turn_returns

DT = torch.float64


def T(x) -> torch.Tensor:
    return torch.tensor(x, dtype=DT)


def run(rewards, group_ids, mask=None, **cfg):
    rewards = T(rewards)
    mask = T(mask) if mask is not None else torch.ones(len(rewards), 2, dtype=DT)
    return compute_advantages(AlgorithmConfig(**cfg), rewards, torch.tensor(group_ids), mask)


def seq_adv(out) -> torch.Tensor:
    """The per-sequence advantage (first token), for estimators that broadcast."""
    return out.advantages[:, 0]


def test_registry():
    assert {"grpo", "rloo", "reinforce_plus_plus", "gae", "turn_grpo"} <= set(advantages.names())
    assert {n for n in advantages.names() if advantages.spec(n).per_turn} == {"gae", "turn_grpo"}
    assert set(advantages.describe()) == set(advantages.names())
    with pytest.raises(KeyError, match="valid: grpo"):
        advantages.get("ppo")


# ----------------------------------------------------------------------------- GRPO

# Group 0: R = [1, 0, 1], mean 2/3, deviations [1/3, -2/3, 1/3], sum of squares 2/3.
# Group 7 (ids need not be contiguous): one response.
REWARDS, GROUPS = [1.0, 0.0, 1.0, 5.0], [0, 0, 0, 7]


def test_grpo_unbiased_std():
    # std = sqrt((2/3) / (3 - 1)) = sqrt(1/3) = 0.57735
    out = run(REWARDS, GROUPS)
    s = math.sqrt(1 / 3)
    expected = T([(1 / 3) / s, (-2 / 3) / s, (1 / 3) / s, 0.0])
    assert torch.allclose(seq_adv(out), expected, atol=1e-5)  # eps = 1e-6 in the denominator
    assert torch.allclose(out.returns, T(REWARDS).unsqueeze(-1).expand(4, 2))


def test_grpo_biased_std():
    # std = sqrt((2/3) / 3) = sqrt(2)/3 = 0.4714 -> A = [0.7071, -1.4142, 0.7071]
    out = run(REWARDS, GROUPS, std_unbiased=False)
    assert torch.allclose(seq_adv(out), T([0.5**0.5, -(2**0.5), 0.5**0.5, 0.0]), atol=1e-5)


def test_grpo_without_std_is_dr_grpo():
    out = run(REWARDS, GROUPS, std_normalize=False)
    assert torch.allclose(seq_adv(out), T([1 / 3, -2 / 3, 1 / 3, 0.0]))
    # Dr. GRPO's preset turns std normalisation off by itself.
    cfg = AlgorithmConfig(loss="dr_grpo", max_response_length=4)
    out = compute_advantages(cfg, T(REWARDS), torch.tensor(GROUPS), torch.ones(4, 2, dtype=DT))
    assert torch.allclose(seq_adv(out), T([1 / 3, -2 / 3, 1 / 3, 0.0]))


def test_grpo_equal_rewards_and_singletons_give_zero_not_nan():
    out = run([1.0, 1.0, 3.0], [4, 4, 5])
    assert torch.equal(out.advantages, torch.zeros(3, 2, dtype=DT))


def test_sequence_advantages_are_broadcast_to_response_tokens_only():
    out = run([1.0, 0.0], [0, 0], mask=[[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]], std_normalize=False)
    assert torch.equal(out.advantages, T([[0.0, 0.5, 0.5], [-0.5, 0.0, 0.0]]))


def test_group_stats():
    mean, std, n = group_stats(T([1.0, 0.0, 1.0, 5.0]), torch.tensor([0, 0, 0, 7]), unbiased=True)
    assert torch.allclose(mean, T([2 / 3] * 3 + [5.0]))
    assert torch.allclose(std, T([math.sqrt(1 / 3)] * 3 + [0.0]))
    assert torch.equal(n, T([3.0, 3.0, 3.0, 1.0]))


# ----------------------------------------------------------------------------- RLOO


def test_rloo_leave_one_out():
    # Group 0: A_0 = 1 - (0 + 1)/2 = 0.5, A_1 = 0 - (1 + 1)/2 = -1, A_2 = 0.5. Singleton: 0.
    out = run(REWARDS, GROUPS, advantage="rloo")
    assert torch.allclose(seq_adv(out), T([0.5, -1.0, 0.5, 0.0]))


# ----------------------------------------------------------------------------- REINFORCE++


def test_reinforce_plus_plus_batch_normalised():
    # R = [1, 2, 3, 4] (groups ignored): mean 2.5, unbiased std sqrt(5/3) = 1.290994.
    out = run([1.0, 2.0, 3.0, 4.0], [0, 0, 1, 1], advantage="reinforce_plus_plus")
    s = math.sqrt(5 / 3)
    assert torch.allclose(seq_adv(out), T([-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s]), atol=1e-5)


def test_reinforce_plus_plus_ignores_empty_rows_and_single_sequences():
    # Row 2 has no response token: it neither shifts the batch mean nor gets an advantage.
    out = run(
        [1.0, 3.0, 100.0],
        [0, 1, 2],
        mask=[[1, 1], [1, 1], [0, 0]],
        advantage="reinforce_plus_plus",
        std_normalize=False,
    )
    assert torch.allclose(out.advantages, T([[-1.0, -1.0], [1.0, 1.0], [0.0, 0.0]]))
    out = run([2.0], [0], advantage="reinforce_plus_plus")
    assert torch.equal(out.advantages, torch.zeros(1, 2, dtype=DT))


def test_reinforce_plus_plus_with_token_rewards():
    # Returns-to-go (gamma = 1): row 0 r = [0.5, 1] -> G = [1.5, 1]; row 1 r = [-1, pad] -> G = [-1].
    # Over the 3 response tokens: mean 0.5, unbiased std sqrt(3.5 / 2) = 1.322876.
    cfg = AlgorithmConfig(advantage="reinforce_plus_plus")
    mask = T([[1.0, 1.0], [1.0, 0.0]])
    out = compute_advantages(
        cfg, T([1.0, -1.0]), torch.tensor([0, 1]), mask, token_rewards=T([[0.5, 1.0], [-1.0, 0.0]])
    )
    s = math.sqrt(1.75)
    assert torch.allclose(out.returns, T([[1.5, 1.0], [-1.0, 0.0]]))
    assert torch.allclose(out.advantages, T([[1.0 / s, 0.5 / s], [-1.5 / s, 0.0]]), atol=1e-5)


# ----------------------------------------------------------------------------- GAE


def test_gae_by_hand():
    # V = [0.5, 0.4, 0.3], R = 1 on the last token, gamma = 1, lam = 0.5:
    # delta = [0 + 0.4 - 0.5, 0 + 0.3 - 0.4, 1 + 0 - 0.3] = [-0.1, -0.1, 0.7]
    # A_2 = 0.7;  A_1 = -0.1 + 0.5 * 0.7 = 0.25;  A_0 = -0.1 + 0.5 * 0.25 = 0.025
    cfg = AlgorithmConfig(name="ppo", advantage="gae", lam=0.5)
    values = T([[0.5, 0.4, 0.3]])
    out = compute_advantages(
        cfg, T([1.0]), torch.tensor([0]), torch.ones(1, 3, dtype=DT), values=values
    )
    assert torch.allclose(out.advantages, T([[0.025, 0.25, 0.7]]))
    assert torch.allclose(out.returns, T([[0.525, 0.65, 1.0]]))


def test_gae_skips_padding_and_discounts():
    # The same response, left-padded by one position, gives the same numbers shifted right.
    cfg = AlgorithmConfig(name="ppo", advantage="gae", lam=0.5)
    out = compute_advantages(
        cfg,
        T([1.0]),
        torch.tensor([0]),
        T([[0.0, 1.0, 1.0, 1.0]]),
        values=T([[9.0, 0.5, 0.4, 0.3]]),
    )
    assert torch.allclose(out.advantages, T([[0.0, 0.025, 0.25, 0.7]]))
    # gamma = 0.9, lam = 1, V = 0: A_t = 0.9^(T-1-t) * R (Monte Carlo return).
    cfg = AlgorithmConfig(name="ppo", advantage="gae", gamma=0.9, lam=1.0)
    out = compute_advantages(
        cfg,
        T([1.0]),
        torch.tensor([0]),
        torch.ones(1, 3, dtype=DT),
        values=torch.zeros(1, 3, dtype=DT),
    )
    assert torch.allclose(out.advantages, T([[0.81, 0.9, 1.0]]))


def test_gae_with_token_rewards_and_gaps():
    # A multi-turn response: position 1 is an environment token (mask 0), skipped by the scan.
    # r = [0.2, -, 1.0], V = 0, gamma = lam = 1: A = [1.2, 0, 1.0].
    cfg = AlgorithmConfig(name="ppo", advantage="gae", lam=1.0)
    mask = T([[1.0, 0.0, 1.0]])
    out = compute_advantages(
        cfg,
        T([0.0]),
        torch.tensor([0]),
        mask,
        values=torch.zeros(1, 3, dtype=DT),
        token_rewards=T([[0.2, 5.0, 1.0]]),
    )
    assert torch.allclose(out.advantages, T([[1.2, 0.0, 1.0]]))


def test_discounted_scan_is_return_to_go_with_zero_values():
    r = T([[1.0, 2.0, 3.0]])
    out = discounted_scan(r, torch.zeros_like(r), torch.ones_like(r), gamma=0.5, lam=1.0)
    assert torch.allclose(out, T([[1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3.0]]))


def test_last_token_rewards():
    out = last_token_rewards(T([1.0, 2.0, 3.0]), T([[1, 1, 0], [0, 0, 0], [0, 1, 1]]))
    assert torch.equal(out, T([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 3.0]]))


# ----------------------------------------------------------------------------- per turn (episodes)

# Three episodes as rows: mask 1 on model tokens, 0 on observation tokens; a turn is a run of 1s.
#   A (group 0): turns [0, 1] and [3, 4], turn rewards 0.2 and 1.0 (9.0 on an observation: ignored)
#   B (group 0): one turn [0, 2], reward 0.4
#   C (group 5): turns [0] and [2], rewards 1.0 and 0.0
TURN_MASK = [[1, 1, 0, 1, 1], [1, 1, 1, 0, 0], [1, 0, 1, 0, 0]]
TURN_REWARDS = [[0.0, 0.2, 9.0, 0.0, 1.0], [0.0, 0.0, 0.4, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0]]


def test_turns_are_runs_of_model_tokens_and_their_returns_discount_per_turn():
    mask = T(TURN_MASK)
    assert torch.equal(turn_index(mask), torch.tensor([[0, 0, -1, 1, 1], [0, 0, 0, -1, -1], [0, -1, 1, -1, -1]]))
    # gamma = 0.5: A: G1 = 1.0, G0 = 0.2 + 0.5 * 1.0 = 0.7; B: 0.4; C: G1 = 0, G0 = 1.0 + 0.5 * 0 = 1.0.
    G, turns = turn_returns(T(TURN_REWARDS), mask, gamma=0.5)
    assert torch.allclose(G, T([[0.7, 1.0], [0.4, 0.0], [1.0, 0.0]])) and turns.tolist() == [2, 1, 2]
    assert torch.allclose(spread_over_turns(G, mask)[0], T([0.7, 0.7, 0.0, 1.0, 1.0]))


def test_turn_grpo_by_hand():
    # Group 0 pools the turn returns {0.7, 1.0 (A), 0.4 (B)}: mean 0.7, deviations [0, 0.3, -0.3],
    # unbiased std sqrt(0.18 / 2) = 0.3. Group 5 pools {1.0, 0.0}: mean 0.5, std sqrt(0.5).
    cfg = AlgorithmConfig(advantage="turn_grpo", gamma=0.5)
    args = (cfg, T([1.2, 0.4, 1.0]), torch.tensor([0, 0, 5]), T(TURN_MASK))
    out = compute_advantages(*args, token_rewards=T(TURN_REWARDS))
    c = 0.5 / math.sqrt(0.5)
    assert torch.allclose(
        out.advantages, T([[0, 0, 0, 1, 1], [-1, -1, -1, 0, 0], [c, 0, -c, 0, 0]]), atol=1e-5
    )
    assert torch.allclose(out.returns, T([[0.7, 0.7, 0, 1, 1], [0.4, 0.4, 0.4, 0, 0], [1, 0, 0, 0, 0]]))
    no_std = compute_advantages(
        AlgorithmConfig(advantage="turn_grpo", gamma=0.5, std_normalize=False), *args[1:],
        token_rewards=T(TURN_REWARDS),
    )
    assert torch.allclose(no_std.advantages, T([[0, 0, 0, 0.3, 0.3], [-0.3] * 3 + [0, 0], [0.5, 0, -0.5, 0, 0]]))


def test_turn_grpo_on_one_turn_answers_is_grpo():
    mask = T([[0, 1, 1], [1, 1, 0], [1, 1, 1], [0, 0, 1]])
    rewards, groups = T([1.0, 0.0, 1.0, 5.0]), torch.tensor([0, 0, 0, 7])
    grpo = compute_advantages(AlgorithmConfig(), rewards, groups, mask)
    turns = compute_advantages(AlgorithmConfig(advantage="turn_grpo", gamma=0.3), rewards, groups, mask)
    assert torch.allclose(turns.advantages, grpo.advantages)


def test_gae_across_turns_bootstraps_from_the_next_model_token():
    # Two turns with two observation tokens between them (values 9 there: never used).
    # t=3: delta = 1.0 - 0.6 = 0.4; A = 0.4.
    # t=0: delta = 0.5 + 0.9 * V(3) - V(0) = 0.5 + 0.54 - 0.2 = 0.84; A = 0.84 + 0.9 * 0.8 * 0.4 = 1.128.
    cfg = AlgorithmConfig(name="ppo", advantage="gae", gamma=0.9, lam=0.8)
    out = compute_advantages(
        cfg, T([1.5]), torch.tensor([0]), T([[1, 0, 0, 1]]),
        values=T([[0.2, 9.0, 9.0, 0.6]]), token_rewards=T([[0.5, 0.0, 0.0, 1.0]]),
    )
    assert torch.allclose(out.advantages, T([[1.128, 0, 0, 0.4]]))
    assert torch.allclose(out.returns, T([[1.328, 0, 0, 1.0]]))


# ----------------------------------------------------------------------------- errors and properties


def test_errors_name_the_fix():
    cfg = AlgorithmConfig(name="ppo", advantage="gae")
    with pytest.raises(ValueError, match="needs values"):
        compute_advantages(cfg, T([1.0]), torch.tensor([0]), torch.ones(1, 2, dtype=DT))
    with pytest.raises(ValueError, match="sequence-level"):
        compute_advantages(
            AlgorithmConfig(),
            T([1.0]),
            torch.tensor([0]),
            torch.ones(1, 2, dtype=DT),
            token_rewards=torch.ones(1, 2, dtype=DT),
        )
    with pytest.raises(ValueError, match=r"must both be \(2,\)"):
        compute_advantages(
            AlgorithmConfig(), T([1.0]), torch.tensor([0]), torch.ones(2, 2, dtype=DT)
        )


@settings(max_examples=50, deadline=None)
@given(
    name=st.sampled_from(["grpo", "rloo", "reinforce_plus_plus", "gae", "turn_grpo"]),
    B=st.integers(1, 6),
    L=st.integers(1, 5),
    seed=st.integers(0, 2**31 - 1),
    std_normalize=st.booleans(),
)
def test_advantages_are_finite_and_zero_off_mask(name, B, L, seed, std_normalize):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 2, (B,), generator=g).to(DT)  # binary rewards: many equal groups
    group_ids = torch.randint(0, 3, (B,), generator=g)
    mask = (torch.rand(B, L, generator=g) < 0.7).to(DT)
    values = torch.randn(B, L, generator=g, dtype=DT) if name == "gae" else None
    algo = "ppo" if name == "gae" else "grpo"
    cfg = AlgorithmConfig(name=algo, advantage=name, std_normalize=std_normalize)
    out = compute_advantages(cfg, rewards, group_ids, mask, values=values)
    assert torch.isfinite(out.advantages).all() and torch.isfinite(out.returns).all()
    assert torch.all(out.advantages[mask == 0] == 0)


def test_integer_rewards_are_accepted():
    out = compute_advantages(
        AlgorithmConfig(std_normalize=False),
        torch.tensor([1, 0]),
        torch.tensor([0, 0]),
        torch.ones(2, 1),
    )
    assert torch.allclose(out.advantages, torch.tensor([[0.5], [-0.5]]))
