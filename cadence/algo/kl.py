"""Per-token estimators of KL(pi_theta || pi_ref) and the two ways to use them.

Tokens are sampled from (approximately) pi_theta, so with
log_ratio = log pi_ref(y_t) - log pi_theta(y_t) (Schulman's "Approximating KL
divergence" notes):

    k1 = -log_ratio                            unbiased, can be negative
    k2 = 0.5 * log_ratio^2                     biased, low variance, >= 0
    k3 = exp(log_ratio) - log_ratio - 1        unbiased, low variance, >= 0

k3 is what GRPO (DeepSeekMath) adds to its loss.

Their gradients, as a loss term (d = log pi_ref - log pi_theta, so
grad d = -grad log pi_theta; expectations over y ~ pi_theta). The gradient we
want is that of KL(pi_theta || pi_ref) = E[-d], which is
E[-d grad log pi_theta] (the score-function term; E[grad log pi_theta] = 0):

    grad k1 = grad log pi_theta               E = 0: no signal at all, only noise
    grad k2 = d grad d = -d grad log pi_theta E = grad KL(pi_theta || pi_ref): exact
    grad k3 = (1 - pi_ref/pi_theta) grad log pi_theta
                                              E = -E_{pi_ref}[grad log pi_theta]
                                                = grad KL(pi_ref || pi_theta): the *forward* KL

So k3 is a good (unbiased, low-variance) estimate of the KL's *value*, but
differentiating it optimises the other direction of the KL; verl's
"low_var_kl" is k3 (clamped to [-10, 10]) and inherits this. `k2_grad` is the
fix: the value of k3 and the gradient of k2,
    k2_grad = sg(k3 - k2) + k2,
so the logged number is k3's and the update is the reverse KL's. (Tokens come
from mu, not pi_theta, in asynchronous runs; the KL term is not importance
weighted, as in verl and TRL.)

Two places to use the penalty:
- as a loss term (`kl.mode = "loss"`): `kl_loss` aggregates the estimator,
  which carries gradient through log pi_theta; the trainer adds coef * it.
- as reward shaping (`kl.mode = "reward"`): `kl_reward_penalty` gives a
  detached per-token penalty coef * k that `shape_token_rewards` subtracts from
  the token rewards before advantages are computed (InstructGPT-style PPO,
  REINFORCE++).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from cadence.algo.advantages import last_token_rewards
from cadence.algo.aggregation import aggregate

if TYPE_CHECKING:
    from cadence.algo.config import KLConfig


def kl_estimate(
    logprobs: Tensor, ref_logprobs: Tensor, estimator: str, max_log_ratio: float = 20.0
) -> Tensor:
    """Per-token KL(pi_theta || pi_ref) estimate, same shape as the inputs.

    With d = log pi_ref - log pi_theta (clamped to [-max_log_ratio, max_log_ratio]
    so exp() cannot overflow):
        k1 = -d,  k2 = d^2 / 2,  k3 = exp(d) - d - 1,  k2_grad = k3 in value, k2 in gradient.
    """
    log_ratio = (ref_logprobs - logprobs).clamp(-max_log_ratio, max_log_ratio)
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        # expm1 keeps precision when d is tiny (exp(d) - 1 cancels badly in float32).
        return torch.expm1(log_ratio) - log_ratio
    if estimator == "k2_grad":
        k2 = 0.5 * log_ratio.square()
        return (torch.expm1(log_ratio) - log_ratio - k2).detach() + k2
    raise ValueError(f"unknown KL estimator {estimator!r}; valid: k1, k2, k3, k2_grad")


class AdaptiveKLController:
    """Ziegler et al. (2019), "Fine-Tuning Language Models from Human Preferences", section 2.2:

        e = clip(KL / target - 1, -0.2, 0.2),    beta <- beta * (1 + e * n / horizon)

    with KL the measured KL(pi_theta || pi_ref) of a step and n its batch size
    (sequences). beta grows while the policy drifts past the target and shrinks
    below it, by at most 20% per `horizon` samples.
    """

    def __init__(self, coef: float, target: float, horizon: int) -> None:
        self.coef, self.target, self.horizon = coef, target, horizon

    def update(self, kl: float, n: int) -> float:
        error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.coef *= 1.0 + error * n / self.horizon
        return self.coef


def kl_loss(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    cfg: KLConfig,
    mode: str,
    token_denominator: float | None = None,
    seq_denominator: float | None = None,
    norm_length: float | None = None,
) -> Tensor:
    """KL as a loss term: aggregate(k(log pi_theta, log pi_ref), mask, mode). Not yet times coef.

    Gradient flows through `logprobs`; `ref_logprobs` is detached.
    """
    per_token = kl_estimate(logprobs, ref_logprobs.detach(), cfg.estimator, cfg.max_log_ratio)
    return aggregate(per_token, mask, mode, token_denominator, seq_denominator, norm_length)


def kl_reward_penalty(
    logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, cfg: KLConfig
) -> Tensor:
    """KL as reward shaping: per-token penalty coef * k(log pi, log pi_ref) * m, detached.

    `logprobs` here are the sampling policy's (behaviour or proximal) log-probs:
    the penalty is part of the reward, a fixed number, never differentiated.
    """
    k = kl_estimate(logprobs.detach(), ref_logprobs.detach(), cfg.estimator, cfg.max_log_ratio)
    return cfg.coef * k * mask


def shape_token_rewards(
    rewards: Tensor,
    mask: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    cfg: KLConfig,
    token_rewards: Tensor | None = None,
) -> Tensor:
    """Token rewards with a KL penalty: r[i, t] = R_i [t = last] - coef * k[i, t] * m[i, t].

    `token_rewards` [B, T], when given, replaces R_i [t = last] (an episode's
    rewards, each on its turn's last token). Feed the result to
    `compute_advantages(..., token_rewards=...)` with an estimator that
    accepts token rewards (gae, reinforce_plus_plus, turn_grpo).
    """
    base = last_token_rewards(rewards, mask) if token_rewards is None else token_rewards
    return base - kl_reward_penalty(logprobs, ref_logprobs, mask, cfg)
