"""beta*: ROLL Flash's split between generation and training, by hand and from metrics."""

from __future__ import annotations

import pytest

from cadence.runtime import placement
from cadence.runtime.config import RuntimeConfig
from cadence.runtime.split import Split, beta_star, measured_split


def test_beta_star_by_hand():
    # N=100, K=2, mu_gen=0.02, L_gen=3, mu_train=0.01, alpha=2, E=1:
    # train = 1; total = 2 + 2*3/3 + 1 = 5 -> 0.2
    assert beta_star(100, 2, 0.02, 3.0, 0.01, alpha=2) == pytest.approx(0.2)
    # more passes over the batch push the share towards training: E=3 -> 3 / (2 + 2 + 3)
    assert beta_star(100, 2, 0.02, 3.0, 0.01, alpha=2, epochs=3) == pytest.approx(3 / 7)
    # a larger alpha hides the long tail: alpha=0 -> 1 / (2 + 6 + 1)
    assert beta_star(100, 2, 0.02, 3.0, 0.01, alpha=0) == pytest.approx(1 / 9)


def test_measured_split_reads_a_runs_metrics():
    rec = lambda busy, steps, samples, train, longest: {  # noqa: E731
        "train/seconds": train, "rollout/engine_busy_s": busy, "rollout/engine_steps": steps,
        "rollout/samples_total": samples, "response/length_max": longest,
    }
    records = [rec(9.0, 50, 100, 5.0, 10), rec(11.0, 150, 200, 1.0, 40), rec(13.0, 250, 300, 3.0, 20)]
    split = measured_split(records, batch=100, workers=1, alpha=1)
    assert split.mu_gen == pytest.approx(4.0 / 200)  # busy seconds per sample after the first step
    assert split.l_gen == pytest.approx(4.0 / 200 * 40)  # seconds per engine step x longest response
    assert split.mu_train == pytest.approx(2.0 / 100)  # mean train seconds (first step skipped) per sample
    assert split.beta == pytest.approx(beta_star(100, 1, split.mu_gen, split.l_gen, split.mu_train, 1))
    assert measured_split(records[:1], batch=100, workers=1, alpha=1) is None
    # Two records are enough: the second step's differences from the first.
    two = measured_split(records[:2], batch=100, workers=1, alpha=1)
    assert two.mu_gen == pytest.approx(2.0 / 100) and two.mu_train == pytest.approx(1.0 / 100)


def test_beta_star_of_nothing_measured_is_zero():
    assert beta_star(100, 2, 0.0, 0.0, 0.0, alpha=1) == 0.0


def test_cores_keep_one_for_each_side():
    assert Split(0, 0, 0, beta=0.05).cores(2) == (1, 1)
    assert Split(0, 0, 0, beta=0.5).cores(16) == (8, 8)
    assert Split(0, 0, 0, beta=0.99).cores(4) == (1, 3)


def test_trainer_threads_are_what_the_rollout_workers_leave(monkeypatch):
    monkeypatch.setattr(placement, "cpu_share", lambda: 8)
    ray = {"kind": "ray", "rollout_workers": 2}
    assert placement.trainer_threads(RuntimeConfig(**ray, rollout_cpus=1.5)) == 8 - 3
    assert placement.trainer_threads(RuntimeConfig(**ray, rollout_cpus=4)) == 1  # at least one
    assert placement.trainer_threads(RuntimeConfig(**ray, threads=3)) == 3  # asked for
    assert placement.trainer_threads(RuntimeConfig()) == 8  # inline: the generation thread shares them
