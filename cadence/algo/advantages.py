"""Advantage estimators: rewards (and values) in, per-token advantages out.

Inputs: R [B] one scalar reward per response; group_ids [B] (responses to the
same prompt share an id; ids need not be contiguous); mask [B, T] response
tokens; optionally values V [B, T] (critic) and token_rewards r [B, T].

Sequence-level estimators (grpo, rloo, reinforce_plus_plus without token
rewards) compute one A_i per response and broadcast it to its tokens:
A[i, t] = A_i * m[i, t]. Token-level ones (gae, reinforce_plus_plus with
token rewards) run a reverse scan over the response tokens; turn_grpo gives
every token of an episode's turn that turn's normalised return-to-go.

Per-turn estimators (`per_turn`: gae, turn_grpo) are handed the batch's token
rewards by the trainer: an episode's turn rewards, each on its turn's last
model token (a single answer: R on its last token, the same as without them).
The others see R, the episode's return (the sum of its turn rewards).

Std: `std_unbiased=True` (default) uses the Bessel-corrected sample std
(divide by n - 1), as torch.std, TRL and verl do; False divides by n. A group
of one has std 0 by definition here (not NaN), so its GRPO advantage is 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from cadence.algo.catalog import ADVANTAGES, AdvantageInfo, add_entry, attach
from cadence.algo.turn_returns import spread_over_turns, turn_returns

if TYPE_CHECKING:
    from cadence.algo.config import AlgorithmConfig


@dataclass
class AdvantageOutput:
    """advantages [B, T] for the policy loss; returns [B, T] targets for a critic."""

    advantages: Tensor
    returns: Tensor


AdvantageFn = Callable[
    ["AlgorithmConfig", Tensor, Tensor, Tensor, "Tensor | None", "Tensor | None"], AdvantageOutput
]


@dataclass(frozen=True)
class AdvantageSpec:
    """A registered estimator: its function and its catalog entry (catalog.AdvantageInfo)."""

    name: str
    fn: AdvantageFn
    description: str
    needs_values: bool = False
    accepts_token_rewards: bool = False
    per_turn: bool = False  # reads the batch's per-turn token rewards (see the module docstring)


# ----------------------------------------------------------------------------- registry

_FUNCTIONS: dict[str, AdvantageFn] = {}


def implements(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: `fn` is the advantage estimator that catalog.ADVANTAGES lists under `name`."""
    return attach(_FUNCTIONS, ADVANTAGES, "advantage estimator", name)


def register(
    name: str,
    description: str,
    needs_values: bool = False,
    accepts_token_rewards: bool = False,
    per_turn: bool = False,
) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: make `fn` available as `AlgorithmConfig(advantage=name)`."""
    info = AdvantageInfo(description, needs_values, accepts_token_rewards, per_turn)
    add_entry(ADVANTAGES, "advantage estimator", name, info)
    return implements(name)


def get(name: str) -> AdvantageFn:
    """The estimator registered under `name`."""
    return spec(name).fn


def spec(name: str) -> AdvantageSpec:
    """The full registry entry (function, description, what it needs)."""
    if name not in _FUNCTIONS:
        raise KeyError(f"unknown advantage estimator {name!r}; valid: {', '.join(names())}")
    info = ADVANTAGES[name]
    return AdvantageSpec(
        name, _FUNCTIONS[name], info.description, info.needs_values, info.accepts_token_rewards, info.per_turn
    )


def names() -> list[str]:
    """Registered estimator names, in registration order."""
    return list(_FUNCTIONS)


def describe() -> dict[str, str]:
    """name -> one-line description."""
    return {name: ADVANTAGES[name].description for name in _FUNCTIONS}


# ----------------------------------------------------------------------------- helpers


def group_stats(
    rewards: Tensor, group_ids: Tensor, unbiased: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample (mean_g, std_g, n_g) of the group each sample belongs to, each [B].

    std_g = sqrt(sum_{j in g} (R_j - mean_g)^2 / (n_g - 1 if unbiased else n_g)); 0 when n_g = 1.
    """
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    zeros = torch.zeros(n_groups, dtype=rewards.dtype, device=rewards.device)
    count = zeros.scatter_add(0, inverse, torch.ones_like(rewards))
    mean = zeros.scatter_add(0, inverse, rewards) / count
    sq_dev = zeros.scatter_add(0, inverse, (rewards - mean[inverse]).square())
    dof = (count - 1.0) if unbiased else count
    # A group of one has sq_dev = 0; flooring dof at 1 keeps 0/0 from becoming NaN.
    std = torch.sqrt(sq_dev / dof.clamp(min=1.0))
    return mean[inverse], std[inverse], count[inverse]


def last_token_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """r[i, t] = R_i at the last response token of row i, 0 elsewhere (empty rows: all 0)."""
    B, T = mask.shape
    positions = torch.arange(T, device=mask.device).expand(B, T)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(dim=-1).values
    token_rewards = torch.zeros(B, T, dtype=rewards.dtype, device=rewards.device)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    token_rewards[rows, last[rows]] = rewards[rows]
    return token_rewards


def discounted_scan(
    token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> Tensor:
    """GAE over the response tokens only (masked positions are skipped, not treated as steps).

        delta_t = r_t + gamma * V_{t'} - V_t          t' = next response token (V = 0 past the end)
        A_t     = delta_t + gamma * lam * A_{t'}

    With V = 0 and lam = 1 this is the discounted return-to-go sum_{k>=t} gamma^(k-t) r_k.
    Skipping masked positions makes left padding, right padding and
    multi-turn environment tokens inside a response all work the same.
    """
    B, T = mask.shape
    advantages = torch.zeros_like(values)
    next_value = torch.zeros(B, dtype=values.dtype, device=values.device)
    running = torch.zeros_like(next_value)
    for t in reversed(range(T)):
        on = mask[:, t] > 0
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(on, delta + gamma * lam * running, running)
        next_value = torch.where(on, values[:, t], next_value)
        advantages[:, t] = torch.where(on, running, torch.zeros_like(running))
    return advantages


def _broadcast(per_seq: Tensor, mask: Tensor) -> Tensor:
    return per_seq.unsqueeze(-1) * mask


# ----------------------------------------------------------------------------- estimators


@implements("grpo")
def grpo_advantages(
    cfg: AlgorithmConfig,
    rewards: Tensor,
    group_ids: Tensor,
    mask: Tensor,
    values: Tensor | None = None,
    token_rewards: Tensor | None = None,
) -> AdvantageOutput:
    """A_i = (R_i - mean_g R) / (std_g R + adv_eps)   (std_normalize=True, GRPO)
    A_i =  R_i - mean_g R                          (std_normalize=False, Dr. GRPO)

    The group mean is the baseline: every prompt is its own "critic", so no
    value model is needed. Returns are R_i broadcast to the tokens.
    """
    mean, std, _ = group_stats(rewards, group_ids, cfg.std_unbiased)
    adv = rewards - mean
    if cfg.std_normalize:
        adv = adv / (std + cfg.adv_eps)
    return AdvantageOutput(_broadcast(adv, mask), _broadcast(rewards, mask))


@implements("rloo")
def rloo_advantages(
    cfg: AlgorithmConfig,
    rewards: Tensor,
    group_ids: Tensor,
    mask: Tensor,
    values: Tensor | None = None,
    token_rewards: Tensor | None = None,
) -> AdvantageOutput:
    """A_i = R_i - (sum_{j in g, j != i} R_j) / (n_g - 1) = n_g / (n_g - 1) * (R_i - mean_g R).

    The baseline excludes R_i itself, so it is independent of sample i and the
    estimator stays unbiased. A group of one has no other member: A_i = 0.
    """
    mean, _, count = group_stats(rewards, group_ids, cfg.std_unbiased)
    others = (mean * count - rewards) / (count - 1.0).clamp(min=1.0)
    adv = torch.where(count > 1, rewards - others, torch.zeros_like(rewards))
    return AdvantageOutput(_broadcast(adv, mask), _broadcast(rewards, mask))


@implements("reinforce_plus_plus")
def reinforce_plus_plus_advantages(
    cfg: AlgorithmConfig,
    rewards: Tensor,
    group_ids: Tensor,
    mask: Tensor,
    values: Tensor | None = None,
    token_rewards: Tensor | None = None,
) -> AdvantageOutput:
    """No token rewards:  A_i = (R_i - mean_batch R) / (std_batch R + adv_eps), broadcast.
    Token rewards r:     G_t = sum_{k>=t} gamma^(k-t) r_k; A_t = (G_t - mean G) / (std G + adv_eps),
                         mean and std over every response token of the batch.

    The baseline is the batch, not the group, so it works with any number of
    responses per prompt (including one); the token form is how a per-token KL
    penalty (kl.mode="reward") enters. Batch statistics use only rows with at
    least one response token. std_normalize=False skips the division.
    """
    if token_rewards is None:
        valid = mask.sum(dim=-1) > 0
        if not valid.any():
            zeros = torch.zeros_like(mask, dtype=rewards.dtype)
            return AdvantageOutput(zeros, zeros.clone())
        batch = rewards[valid]
        adv = rewards - batch.mean()
        if cfg.std_normalize:
            std = batch.std(unbiased=cfg.std_unbiased) if batch.numel() > 1 else batch.new_zeros(())
            adv = adv / (std + cfg.adv_eps)
        return AdvantageOutput(_broadcast(adv, mask), _broadcast(rewards, mask))

    returns = discounted_scan(token_rewards, torch.zeros_like(token_rewards), mask, cfg.gamma, 1.0)
    on = mask > 0
    if not on.any():
        return AdvantageOutput(torch.zeros_like(returns), returns)
    flat = returns[on]
    adv = returns - flat.mean()
    if cfg.std_normalize:
        std = flat.std(unbiased=cfg.std_unbiased) if flat.numel() > 1 else flat.new_zeros(())
        adv = adv / (std + cfg.adv_eps)
    return AdvantageOutput(adv * mask, returns)


@implements("gae")
def gae_advantages(
    cfg: AlgorithmConfig,
    rewards: Tensor,
    group_ids: Tensor,
    mask: Tensor,
    values: Tensor | None = None,
    token_rewards: Tensor | None = None,
) -> AdvantageOutput:
    """delta_t = r_t + gamma V_{t+1} - V_t;  A_t = delta_t + gamma lam A_{t+1};  returns = A + V.

    r_t is R_i on the last response token (or the given token rewards), t+1 the
    next response token and V = 0 after the last one. Values are detached:
    advantages are targets, not a path for gradients into the critic.

    Episodes: r_t is the turn's reward on the turn's last model token, 0 on the
    other model tokens. Observation tokens (mask 0) are not steps: the scan
    skips them, so the last token of turn k bootstraps from V at the first
    model token of turn k+1, which is the value of the context that already
    holds the observation, the state the model acts in next. The observation
    is part of the environment's transition, not an action: giving it a step
    (and a value) would discount across it and fit the critic to states where
    the model chooses nothing. gamma and lam apply per model token.
    """
    if values is None:
        raise ValueError("advantage 'gae' needs values [B, T] from a critic")
    values = values.detach() * mask
    r = token_rewards if token_rewards is not None else last_token_rewards(rewards, mask)
    adv = discounted_scan(r * mask, values, mask, cfg.gamma, cfg.lam)
    returns = (adv + values) * mask  # the critic's targets come from the unwhitened advantages
    if cfg.whiten_advantages:
        adv = whiten(adv, mask, cfg.adv_eps)
    return AdvantageOutput(adv, returns)


def whiten(x: Tensor, mask: Tensor, eps: float) -> Tensor:
    """(x - mean) / (std + eps) over the masked entries (std with n - 1), 0 outside the mask.

    verl whitens GAE advantages this way on every step (`masked_whiten`); cadence only when
    `whiten_advantages` is set.
    """
    n = mask.sum().clamp(min=1.0)
    mean = (x * mask).sum() / n
    var = ((x - mean).square() * mask).sum() / (n - 1).clamp(min=1.0)
    return (x - mean) / (var.sqrt() + eps) * mask


@implements("turn_grpo")
def turn_grpo_advantages(
    cfg: AlgorithmConfig,
    rewards: Tensor,
    group_ids: Tensor,
    mask: Tensor,
    values: Tensor | None = None,
    token_rewards: Tensor | None = None,
) -> AdvantageOutput:
    """Every model token of turn k of episode i gets its turn's normalised return-to-go:

        G_ik   = sum_{j>=k} gamma^(j-k) r_ij                 (r_ij: reward of turn j, cadence.algo.turn_returns)
        S_g    = { G_ik : episode i in group g, k < K_i }    (every turn of every episode once)
        mean_g = sum_{S_g} G / |S_g|
        std_g  = sqrt( sum_{S_g} (G - mean_g)^2 / (|S_g| - 1) )    (|S_g| with std_unbiased=False)
        A_it   = (G_ik(t) - mean_g) / (std_g + adv_eps)          (std_normalize=False: G_ik(t) - mean_g)

    Turns are the runs of model tokens (mask 1); observation tokens get 0. The
    baseline pools the group's turns, so a turn is judged against the turns of
    its siblings on the same seed; each turn counts once whatever its length,
    and a longer episode brings more turns to the pool. A one-turn episode has
    G_i0 = R_i: on single answers this is GRPO exactly. Returns are G_ik on the
    turn's tokens. Without token rewards R_i is taken as the last turn's reward.
    """
    r = token_rewards if token_rewards is not None else last_token_rewards(rewards, mask)
    G, turns = turn_returns(r * mask, mask, cfg.gamma)
    K = G.shape[1]
    valid = torch.arange(K, device=mask.device).unsqueeze(0) < turns.unsqueeze(1)  # [B, K]
    if not valid.any():
        zeros = torch.zeros_like(mask)
        return AdvantageOutput(zeros, zeros.clone())
    pooled_ids = group_ids.unsqueeze(1).expand(-1, K)[valid]
    mean, std, _ = group_stats(G[valid], pooled_ids, cfg.std_unbiased)
    adv = G[valid] - mean
    if cfg.std_normalize:
        adv = adv / (std + cfg.adv_eps)
    per_turn = torch.zeros_like(G)
    per_turn[valid] = adv
    return AdvantageOutput(spread_over_turns(per_turn, mask), spread_over_turns(G, mask))


# ----------------------------------------------------------------------------- entry point


def compute_advantages(
    cfg: AlgorithmConfig,
    rewards: Tensor,
    group_ids: Tensor,
    mask: Tensor,
    values: Tensor | None = None,
    token_rewards: Tensor | None = None,
) -> AdvantageOutput:
    """Run the estimator named by `cfg.advantage`; see each estimator for its equation.

    rewards [B], group_ids [B] (int), mask [B, T]; values / token_rewards [B, T] when used.
    Everything is computed without gradient.
    """
    est = spec(cfg.advantage)
    B = mask.shape[0]
    if rewards.shape != (B,) or group_ids.shape != (B,):
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must both be ({B},)"
        )
    if token_rewards is not None and not est.accepts_token_rewards:
        accepting = [n for n in names() if spec(n).accepts_token_rewards]
        raise ValueError(
            f"advantage {cfg.advantage!r} is sequence-level and ignores token_rewards; "
            f"use one of {accepting} (or put the KL in the loss: kl.mode='loss')"
        )
    for name, t in (("values", values), ("token_rewards", token_rewards)):
        if t is not None and t.shape != mask.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(mask.shape)}")
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    mask = mask.to(rewards.dtype)
    with torch.no_grad():
        return est.fn(cfg, rewards.detach(), group_ids, mask, values, token_rewards)
