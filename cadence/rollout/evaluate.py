"""Held-out accuracy: pass@1 and pass@k of a policy on a task's test prompts (the producers
play them: `GroupProducer.evaluate`).

pass@k uses the unbiased estimator of Chen et al. (2021): with n samples of
which c are correct, pass@k = 1 - C(n-c, k) / C(n, k), averaged over prompts.
An answer is correct when its reward is at least 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


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
