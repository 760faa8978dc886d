"""Policy losses: the off-policy loss zoo behind one entry point.

Notation (shared by every docstring here): pi_theta the policy being trained
(`logprobs`, carries gradient); pi_old the proximal policy, i.e. the weights at
the start of this training step with log-probs *recomputed by the trainer*
(`old_logprobs`); mu the behaviour policy, i.e. the inference engine's
log-probs of the sampled tokens (`behaviour_logprobs`); A the advantage;
r = pi_theta / pi_old per token; sg = stop-gradient.

Every loss returns a [B, T] per-token loss. `compute_policy_loss` (policy_loss.py) then
applies the train/inference mismatch correction (mismatch.py), aggregates
(aggregation.py), adds the KL and entropy terms and collects metrics.

Each built-in loss is listed in catalog.LOSSES (its one line, the config values
it implies, whether it weights by mu): all that `AlgorithmConfig` reads. Add a
loss of your own with `@register("name", "one line", defaults={...})`;
`defaults` are config values the loss implies (e.g. Dr. GRPO's aggregation),
applied by `AlgorithmConfig` to fields the user did not set.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from cadence.algo.catalog import LOSSES, LossInfo, add_entry, attach

if TYPE_CHECKING:
    from cadence.algo.config import AlgorithmConfig


# ----------------------------------------------------------------------------- data types


@dataclass(kw_only=True)
class PolicyLossInputs:
    """Everything a policy loss may need; all token tensors are [B, T].

    logprobs:           log pi_theta(y_t), requires grad.
    old_logprobs:       log pi_old(y_t), proximal policy, recomputed by the trainer.
    advantages:         A[i, t] (sequence advantages already broadcast to tokens).
    mask:               1.0 on response tokens, 0.0 elsewhere.
    behaviour_logprobs: log mu(y_t) from the inference engine; None means mu = pi_old.
    sequence_rewards:   R_i [B]; TOPR splits sequences by it.
    ref_logprobs:       log pi_ref(y_t); needed when kl.coef > 0 and kl.mode = "loss".
    entropy:            per-token entropy of pi_theta, with grad; needed when entropy_coef > 0.
    adv_mask:           AsyPPO's I^A_t (1 keeps the policy-gradient term); None keeps every token.
    entropy_mask:       AsyPPO's I^H_t (1 keeps the entropy bonus); None keeps every token.
    """

    logprobs: Tensor
    old_logprobs: Tensor
    advantages: Tensor
    mask: Tensor
    behaviour_logprobs: Tensor | None = None
    sequence_rewards: Tensor | None = None
    ref_logprobs: Tensor | None = None
    entropy: Tensor | None = None
    adv_mask: Tensor | None = None
    entropy_mask: Tensor | None = None


@dataclass
class TokenLoss:
    """What a loss function returns.

    per_token: [B, T] loss before mismatch correction and aggregation.
    stats: [B, T] per-token quantities (e.g. a 0/1 "was clipped" indicator),
        reported as their mean over response tokens.
    """

    per_token: Tensor
    stats: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class LossOutput:
    """The scalar to call backward() on, and float metrics for logging."""

    loss: Tensor
    metrics: dict[str, float]


LossFn = Callable[[PolicyLossInputs, "AlgorithmConfig"], TokenLoss]


@dataclass(frozen=True)
class LossSpec:
    """A registered loss: its function and its catalog entry (catalog.LossInfo says what the
    description, `defaults` and `behaviour_weighted` mean)."""

    name: str
    fn: LossFn
    description: str
    defaults: Mapping[str, Any]
    behaviour_weighted: bool = False


# ----------------------------------------------------------------------------- registry

_FUNCTIONS: dict[str, LossFn] = {}


def implements(name: str) -> Callable[[LossFn], LossFn]:
    """Decorator: `fn` is the policy loss that catalog.LOSSES lists under `name`."""
    return attach(_FUNCTIONS, LOSSES, "policy loss", name)


def register(
    name: str,
    description: str,
    defaults: Mapping[str, Any] | None = None,
    behaviour_weighted: bool = False,
) -> Callable[[LossFn], LossFn]:
    """Decorator: make `fn` available as `AlgorithmConfig(loss=name)`."""
    add_entry(LOSSES, "policy loss", name, LossInfo(description, dict(defaults or {}), behaviour_weighted))
    return implements(name)


def get(name: str) -> LossFn:
    """The loss function registered under `name`."""
    return spec(name).fn


def spec(name: str) -> LossSpec:
    """The full registry entry (function, description, implied config defaults)."""
    if name not in _FUNCTIONS:
        raise KeyError(f"unknown policy loss {name!r}; valid: {', '.join(names())}")
    info = LOSSES[name]
    return LossSpec(name, _FUNCTIONS[name], info.description, info.defaults, info.behaviour_weighted)


def names() -> list[str]:
    """Registered loss names, in registration order."""
    return list(_FUNCTIONS)


def describe() -> dict[str, str]:
    """name -> one-line description."""
    return {name: LOSSES[name].description for name in _FUNCTIONS}


# ----------------------------------------------------------------------------- shared pieces


def clipped_surrogate(
    ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float, dual_clip: float | None
) -> tuple[Tensor, Tensor, Tensor]:
    """PPO's clipped surrogate, per token, as a loss (to minimise).

        L = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)
        dual clip (c > 1), only where A < 0:  L = min(L, -c A)

    The dual clip bounds the loss of a negative-advantage token whose ratio has
    exploded (r >> 1): without it, -r A grows without limit.
    Returns (loss, clipped, dual_clipped) with the last two 0/1 indicators of
    which branch was taken (clipped: the clip term was strictly the smaller one).
    """
    surr_unclipped = ratio * adv
    surr_clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    loss = -torch.min(surr_unclipped, surr_clipped)
    clipped = (surr_clipped < surr_unclipped).to(ratio.dtype)
    dual = torch.zeros_like(loss)
    if dual_clip is not None:
        cap = -dual_clip * adv
        dual = ((adv < 0) & (loss > cap)).to(ratio.dtype)
        loss = torch.where(adv < 0, torch.min(loss, cap), loss)
    return loss, clipped, dual


def _ratio(inp: PolicyLossInputs) -> Tensor:
    """r = pi_theta / pi_old = exp(log pi_theta - log pi_old); gradient flows through pi_theta."""
    return torch.exp(inp.logprobs - inp.old_logprobs)


def _behaviour_log_ratio(inp: PolicyLossInputs) -> Tensor:
    """log w = log pi_theta - log mu per token; gradient flows through pi_theta."""
    return inp.logprobs - inp.behaviour_logprobs


def _ppo_clip(inp: PolicyLossInputs, cfg: AlgorithmConfig) -> TokenLoss:
    loss, clipped, dual = clipped_surrogate(
        _ratio(inp), inp.advantages, cfg.eps_low, cfg.eps_high, cfg.dual_clip
    )
    return TokenLoss(loss, {"clip_fraction": clipped, "dual_clip_fraction": dual})


# ----------------------------------------------------------------------------- the losses


@implements("ppo")
def ppo_loss(inp: PolicyLossInputs, cfg: AlgorithmConfig) -> TokenLoss:
    """L_t = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A); dual clip: min(L_t, -c A) for A < 0."""
    return _ppo_clip(inp, cfg)


@implements("grpo")
def grpo_loss(inp: PolicyLossInputs, cfg: AlgorithmConfig) -> TokenLoss:
    """L_t = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A).

    GRPO's policy term *is* PPO's; what makes it GRPO lives elsewhere: the
    group-normalised advantage (advantage="grpo") and the KL to a reference
    model added to the loss (kl.coef > 0, kl.estimator="k3", kl.mode="loss").
    Kept as its own name so configs read like the papers.
    """
    return _ppo_clip(inp, cfg)


@implements("dr_grpo")
def dr_grpo_loss(inp: PolicyLossInputs, cfg: AlgorithmConfig) -> TokenLoss:
    """L_t = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), A = R_i - mean_group R.

    Dr. GRPO removes GRPO's two biases: dividing by each response's length
    (which favours long wrong answers) and dividing by the group std (which
    over-weights too-easy/too-hard prompts). The per-token term is unchanged;
    the fixes are its config defaults: aggregation "seq-mean-token-sum-norm"
    (sum over tokens / max_response_length, mean over sequences) and
    std_normalize=False.
    """
    return _ppo_clip(inp, cfg)


@implements("gspo")
def gspo_loss(inp: PolicyLossInputs, cfg: AlgorithmConfig) -> TokenLoss:
    """GSPO-token: s_i = exp(mean_t (log pi_theta - log pi_old)) over response tokens, and

        s_{i,t} = sg(s_i) * pi_theta(y_t) / sg(pi_theta(y_t))     (value s_i, grad s_i * grad log pi_t)
        L_t = -min(s_{i,t} A_t, clip(s_{i,t}, 1 - gspo_eps_low, 1 + gspo_eps_high) A_t)

    With a per-sequence advantage and seq-mean-token-mean aggregation the
    gradient is exactly GSPO's: A_i * grad s_i. Clipping decides per sequence
    (all tokens of a sequence share s_i), hence the tiny default eps.
    """
    log_ratio = (inp.logprobs - inp.old_logprobs) * inp.mask
    seq_log_ratio = log_ratio.sum(-1) / inp.mask.sum(-1).clamp(min=1.0)
    token_log_ratio = seq_log_ratio.detach().unsqueeze(-1) + inp.logprobs - inp.logprobs.detach()
    seq_ratio = torch.exp(token_log_ratio)
    loss, clipped, _ = clipped_surrogate(
        seq_ratio, inp.advantages, cfg.gspo_eps_low, cfg.gspo_eps_high, dual_clip=None
    )
    return TokenLoss(loss, {"clip_fraction": clipped, "seq_ratio_mean": seq_ratio.detach()})


@implements("decoupled_ppo")
def decoupled_ppo_loss(inp: PolicyLossInputs, cfg: AlgorithmConfig) -> TokenLoss:
    """L_t = sg(w_t) * -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A),  w_t = pi_old(y_t) / mu(y_t).

    The clip keeps the update near the *proximal* policy pi_old (recent
    weights), while w corrects for the samples having come from the stale
    behaviour policy mu. Cap (decoupled_behaviour_cap = C):
    "truncate" uses min(w, C); "mask" drops tokens with w > C (AReaL's choice).
    pi_old must stay the step's starting weights across its updates: if
    old_logprobs were re-copied from the current logprobs at every update, r
    would be 1 everywhere and the clip would be dead (one update per batch is
    the exception: there pi_old is the updating policy).
    """
    weight = torch.exp(inp.old_logprobs - inp.behaviour_logprobs).detach()
    capped = torch.zeros_like(weight)
    if cfg.decoupled_behaviour_cap is not None:
        capped = (weight > cfg.decoupled_behaviour_cap).to(weight.dtype)
        if cfg.decoupled_cap_mode == "truncate":
            weight = weight.clamp(max=cfg.decoupled_behaviour_cap)
        else:
            weight = weight * (1.0 - capped)
    ppo = _ppo_clip(inp, cfg)
    ppo.stats |= {"behaviour_weight_mean": weight, "behaviour_capped_fraction": capped}
    return TokenLoss(weight * ppo.per_token, ppo.stats)


@implements("tis")
def tis_loss(inp: PolicyLossInputs, cfg: AlgorithmConfig) -> TokenLoss:
    """L_t = -sg(min(w_t, C)) * A * log pi_theta(y_t),  w_t = pi_old(y_t) / mu(y_t),  C = tis_cap.

    Yao et al. (2025), "Your efficient RL framework secretly brings you
    off-policy RL training": the token policy gradient E_mu[w A grad log pi] with
    the importance weight truncated at C (2 by default) so a token the sampler
    under-weighted cannot blow up the update. mu is the engine's log-prob of the
    sampled token, so the same weight corrects both staleness (mu from an older
    version) and the engine-vs-trainer mismatch. With one update per batch
    pi_old is pi_theta itself and w = pi_theta / mu. ROLL's "tis" is not this
    loss with tis_cap=1: its ratio is pi_theta over the trainer's pi_old
    (1 with one update per batch); this loss is ROLL's vanilla loss times its
    train-inference weight pi_old / mu.
    """
    log_w = (inp.old_logprobs - inp.behaviour_logprobs).detach()
    weight = torch.exp(log_w.clamp(max=math.log(cfg.tis_cap)))
    truncated = (log_w > math.log(cfg.tis_cap)).to(weight.dtype)
    per_token = -weight * inp.advantages * inp.logprobs
    return TokenLoss(per_token, {"clip_fraction": truncated, "is_weight_mean": weight})


@implements("cispo")
def cispo_loss(inp: PolicyLossInputs, cfg: AlgorithmConfig) -> TokenLoss:
    """L_t = -sg(clip(w_t, 1 - cispo_eps_low, 1 + cispo_eps_high)) * A * log pi_theta(y_t) * M_t,
    w_t = pi_theta(y_t) / mu(y_t).

    MiniMax-M1 (2025): the importance weight is taken against the policy that
    generated the sample (mu), clipped, and detached. PPO zeroes the gradient of
    clipped tokens, and in long reasoning those are often the rare "fork"
    tokens; CISPO clips only the weight, so every token keeps its gradient.
    Optional mask (cispo_mask=True) recovers PPO's trust region:
    M_t = 0 if (A > 0 and w > 1 + eps_high) or (A < 0 and w < 1 - eps_low).
    """
    weight_raw = torch.exp(_behaviour_log_ratio(inp)).detach()
    low, high = 1.0 - cfg.cispo_eps_low, 1.0 + cfg.cispo_eps_high
    weight = weight_raw.clamp(low, high)
    clipped = ((weight_raw < low) | (weight_raw > high)).to(weight.dtype)
    per_token = -weight * inp.advantages * inp.logprobs
    stats = {"clip_fraction": clipped, "is_weight_mean": weight}
    if cfg.cispo_mask:
        drop = ((inp.advantages > 0) & (weight_raw > high)) | ((inp.advantages < 0) & (weight_raw < low))
        per_token = torch.where(drop, torch.zeros_like(per_token), per_token)
        stats["cispo_masked_fraction"] = drop.to(weight.dtype)
    return TokenLoss(per_token, stats)


@implements("topr")
def topr_loss(inp: PolicyLossInputs, cfg: AlgorithmConfig) -> TokenLoss:
    """Tapered off-policy REINFORCE, per sequence i with log pi(y_i) = sum_t log pi(y_t):

        R_i >  thr:  L_i = -A_i * log pi_theta(y_i)                              (no IS weight)
        R_i <= thr:  L_i = -sg(min(1, pi_theta(y_i) / mu(y_i))) * A_i * log pi_theta(y_i)

    pi_theta(y_i) / mu(y_i) = exp(sum_t (log pi_theta - log mu)): one truncated
    weight per *sequence*, detached. Successes are imitated at full strength
    whatever their probability (an SFT-like term); failures are pushed down with
    a weight that tapers off once pi_theta assigns them less probability than
    the sampler did, so they cannot be driven to zero without bound. The preset
    aggregates as the paper's sum over a sequence's tokens, mean over
    sequences (seq-mean-token-sum).

    Where cadence differs from the paper: the multiplier is the advantage A_i
    (the configured estimator's, group-normalised by default), not the raw
    reward R_i; the positive/negative split still uses R_i against
    thr = topr_reward_threshold. With advantage=reinforce_plus_plus and
    std_normalize=False the multiplier is R_i minus a batch baseline.
    """
    if inp.sequence_rewards is None:
        raise ValueError(
            "loss 'topr' needs PolicyLossInputs.sequence_rewards (one reward per sequence)"
        )
    positive = (inp.sequence_rewards > cfg.topr_reward_threshold).unsqueeze(-1)
    seq_log_w = (_behaviour_log_ratio(inp).detach() * inp.mask).sum(-1, keepdim=True)
    # min(1, exp(x)) = exp(min(x, 0)): computed in log space, so it never overflows.
    taper = torch.exp(seq_log_w.clamp(max=0.0)).expand_as(inp.logprobs)
    weight = torch.where(positive, torch.ones_like(taper), taper)
    per_token = -weight * inp.advantages * inp.logprobs
    positive_tokens = positive.expand_as(weight).to(weight.dtype)
    return TokenLoss(per_token, {"positive_fraction": positive_tokens, "is_weight_mean": weight})


@implements("reinforce")
def reinforce_loss(inp: PolicyLossInputs, cfg: AlgorithmConfig) -> TokenLoss:
    """L_t = -A_t * log pi_theta(y_t)."""
    return TokenLoss(-inp.advantages * inp.logprobs)
