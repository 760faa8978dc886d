"""The policy losses and advantage estimators by name, with what the config must know of each.

`AlgorithmConfig` checks `loss` and `advantage` against these tables and applies a
loss's presets from them, so validating a config imports no loss code.
losses.py and advantages.py attach a function to each entry (`implements`); a
loss or estimator of one's own adds its entry and its function in one step
(`losses.register`, `advantages.register`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

Fn = TypeVar("Fn", bound=Callable)


@dataclass(frozen=True)
class LossInfo:
    """`defaults`: config values the loss implies (e.g. Dr. GRPO's aggregation), applied to the
    fields the user did not set. `behaviour_weighted`: its own importance weight already divides
    by mu (TIS, CISPO, TOPR, decoupled PPO), so it corrects staleness by itself and must not get
    the mismatch weight pi_old/mu a second time; every other loss gets that weight by default."""

    description: str
    defaults: Mapping[str, Any] = field(default_factory=dict)
    behaviour_weighted: bool = False


@dataclass(frozen=True)
class AdvantageInfo:
    """`needs_values`: reads a critic's values. `accepts_token_rewards`: takes per-token rewards
    (KL in the reward). `per_turn`: reads the batch's per-turn token rewards (advantages.py)."""

    description: str
    needs_values: bool = False
    accepts_token_rewards: bool = False
    per_turn: bool = False


LOSSES: dict[str, LossInfo] = {
    "ppo": LossInfo("PPO clipped surrogate, asymmetric eps_low/eps_high, optional dual clip"),
    "grpo": LossInfo("GRPO: the PPO clip objective; pair with group-normalised advantages and k3 KL"),
    "dr_grpo": LossInfo(
        "Dr. GRPO: PPO clip, no std normalisation, token sums divided by a constant length",
        defaults={"aggregation": "seq-mean-token-sum-norm", "std_normalize": False},
    ),
    "gspo": LossInfo(
        "GSPO: sequence-level ratio (geometric mean of token ratios), clipped per sequence",
        defaults={"aggregation": "seq-mean-token-mean"},
    ),
    "decoupled_ppo": LossInfo(
        "Decoupled PPO (Hilton et al.; AReaL): PPO clip on pi_theta/pi_old times sg(pi_old/mu), optional cap",
        behaviour_weighted=True,
    ),
    "tis": LossInfo(
        "Truncated IS (Yao et al. 2025): -sg(min(pi_old/mu, tis_cap)) A log pi_theta",
        behaviour_weighted=True,
    ),
    "cispo": LossInfo(
        "CISPO (MiniMax-M1): -sg(clip(pi_theta/mu, 1-eps_low, 1+eps_high)) A log pi_theta, every token",
        behaviour_weighted=True,
    ),
    "topr": LossInfo(
        "TOPR (Le Roux et al. 2025): positive sequences SFT-weighted, others by sg(min(1, pi_theta(y)/mu(y)))",
        defaults={"aggregation": "seq-mean-token-sum"},
        behaviour_weighted=True,
    ),
    "reinforce": LossInfo("Plain REINFORCE: -A log pi_theta (on-policy, no ratio, no clip)"),
}

ADVANTAGES: dict[str, AdvantageInfo] = {
    "grpo": AdvantageInfo("group-normalised: (R_i - mean_group) / (std_group + eps); std optional"),
    "rloo": AdvantageInfo("leave-one-out baseline: R_i - mean of the other members of the group"),
    "reinforce_plus_plus": AdvantageInfo(
        "REINFORCE++: rewards (or token returns-to-go) normalised over the whole batch",
        accepts_token_rewards=True,
    ),
    "gae": AdvantageInfo(
        "generalised advantage estimation with a critic (gamma, lam)",
        needs_values=True, accepts_token_rewards=True, per_turn=True,
    ),
    "turn_grpo": AdvantageInfo(
        "per-turn: each turn's discounted return-to-go (gamma per turn), normalised over its group's turns",
        accepts_token_rewards=True, per_turn=True,
    ),
}


def add_entry(table: dict[str, Any], kind: str, name: str, info: Any) -> None:
    """A new name in `table` (LOSSES or ADVANTAGES); `kind` names it in the error."""
    if name in table:
        raise ValueError(f"{kind} {name!r} is already registered")
    table[name] = info


def attach(functions: dict[str, Fn], table: Mapping[str, Any], kind: str, name: str) -> Callable[[Fn], Fn]:
    """Decorator: `fn` implements the entry `name` of `table`; kept in `functions`."""

    def wrap(fn: Fn) -> Fn:
        if name not in table:
            raise ValueError(f"{kind} {name!r} has no entry in cadence/algo/catalog.py; use register()")
        if name in functions:
            raise ValueError(f"{kind} {name!r} is already registered")
        functions[name] = fn
        return fn

    return wrap
