"""Held-out accuracy: pass@1 and pass@k of a policy on a task's test prompts.

pass@k uses the unbiased estimator of Chen et al. (2021): with n samples of
which c are correct, pass@k = 1 - C(n-c, k) / C(n, k), averaged over prompts.
A response is correct when its reward is at least `threshold`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cadence.data.tasks import Prompt
from cadence.inference.hub import InferenceHub
from cadence.inference.types import GenRequest, SamplingParams
from cadence.rewards.guard import RewardGuard
from cadence.rollout.render import PromptRenderer


def pass_at_k(n: int, c: int, k: int) -> float:
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class EvalResult:
    pass_at_1: float
    pass_at_k: float
    k: int
    mean_reward: float
    prompts: int
    canary_pass_rate: float | None = None  # agent.canaries: the share of canary runs that passed (the hack rate)
    canaries: int = 0  # canary runs played

    def as_metrics(self, prefix: str = "eval") -> dict[str, float]:
        out = {
            f"{prefix}/pass@1": self.pass_at_1,
            f"{prefix}/pass@{self.k}": self.pass_at_k,
            f"{prefix}/mean_reward": self.mean_reward,
        }
        if self.canary_pass_rate is not None:
            out[f"{prefix}/canary_pass_rate"] = self.canary_pass_rate
        return out


def evaluate(
    hub: InferenceHub,
    render: PromptRenderer,
    prompts: list[Prompt],
    reward: RewardGuard,
    params: SamplingParams,
    samples: int = 1,
    threshold: float = 1.0,
) -> EvalResult:
    requests = [
        GenRequest(request_id=f"eval/{i}/{j}", prompt_ids=render.ids(p), params=params)
        for i, p in enumerate(prompts)
        for j in range(samples)
    ]
    results = hub.run(requests)
    pairs = [(prompts[int(r.request_id.split("/")[1])], r.text) for r in results]
    outcomes = reward.score(pairs)
    correct = [0] * len(prompts)
    total_reward = 0.0
    for r, o in zip(results, outcomes, strict=True):
        i = int(r.request_id.split("/")[1])
        correct[i] += o.reward >= threshold
        total_reward += o.reward
    return EvalResult(
        pass_at_1=sum(pass_at_k(samples, c, 1) for c in correct) / len(prompts),
        pass_at_k=sum(pass_at_k(samples, c, samples) for c in correct) / len(prompts),
        k=samples,
        mean_reward=total_reward / len(results),
        prompts=len(prompts),
    )
