"""How to split the machine between generation and training (ROLL Flash's beta*).

With K rollout workers, batch N, mean generation time per sample mu_gen (one
worker's busy seconds per sample), longest generation L_gen, training time
per sample mu_train, E passes over each batch and asynchronous ratio alpha,
the asynchronous step time is bounded by

    T_async <= (N / K) (mu_gen + E mu_train) + L_gen / (alpha + 1)

and the share of the resources that should train is

    beta* = E N mu_train / (N mu_gen + K L_gen / (alpha + 1) + E N mu_train).

`measured_split` reads mu_gen, L_gen and mu_train from a run's own metrics,
so every run can print the split it suggests for next time.
"""

from __future__ import annotations

from dataclasses import dataclass


def beta_star(n: int, k: int, mu_gen: float, l_gen: float, mu_train: float, alpha: int, epochs: int = 1) -> float:
    """beta* = E N mu_train / (N mu_gen + K L_gen / (alpha + 1) + E N mu_train)."""
    train = epochs * n * mu_train
    total = n * mu_gen + k * l_gen / (alpha + 1) + train
    return train / total if total > 0 else 0.0


@dataclass
class Split:
    mu_gen: float  # s per sample, one worker busy
    l_gen: float  # s, the longest response of a batch
    mu_train: float  # s per sample
    beta: float  # suggested training share of the resources

    def cores(self, total: int) -> tuple[int, int]:
        """(rollout, training) cores for a machine of `total`, at least one each."""
        train = min(total - 1, max(1, round(self.beta * total)))
        return total - train, train


def measured_split(records: list[dict], batch: int, workers: int, alpha: int, epochs: int = 1) -> Split | None:
    """beta* from metrics.jsonl records: engine busy seconds and steps, train seconds, lengths."""
    needed = ("train/seconds", "rollout/engine_busy_s", "rollout/engine_steps", "rollout/samples_total")
    rs = [r for r in records if all(k in r for k in needed)]
    if len(rs) < 2:
        return None
    first, last = rs[0], rs[-1]  # differences skip the first step's warm-up
    busy = last["rollout/engine_busy_s"] - first["rollout/engine_busy_s"]
    steps = last["rollout/engine_steps"] - first["rollout/engine_steps"]
    samples = last["rollout/samples_total"] - first["rollout/samples_total"]
    if busy <= 0 or steps <= 0 or samples <= 0:
        return None
    mu_gen = busy / samples  # summed over workers: one worker's seconds per sample
    step_s = busy / steps  # one engine step, i.e. one token of every running response
    l_gen = step_s * max(r["response/length_max"] for r in rs[1:])
    mu_train = sum(r["train/seconds"] for r in rs[1:]) / (len(rs) - 1) / batch
    return Split(mu_gen, l_gen, mu_train, beta_star(batch, workers, mu_gen, l_gen, mu_train, alpha, epochs))
