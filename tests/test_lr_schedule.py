"""The trainer's learning-rate schedule: linear warm-up, then constant, cosine or linear decay."""

from __future__ import annotations

import math

import pytest

from cadence.config import TrainerConfig
from cadence.train.trainer import lr_lambda


def factors(**cfg) -> list[float]:
    c = TrainerConfig(**cfg)
    f = lr_lambda(c)
    return [f(i) for i in range(c.steps * c.mini_batches * c.epochs)]


def test_warm_up_climbs_linearly_to_the_base_lr():
    assert factors(steps=6, warmup_steps=4)[:5] == [0.25, 0.5, 0.75, 1.0, 1.0]


def test_linear_decay_after_warm_up_reaches_zero_at_the_last_update():
    # 2 warm-up updates, then 8 decay over the remaining 10 - 2: 1, 7/8, ..., 1/8.
    got = factors(steps=5, mini_batches=2, warmup_steps=2, schedule="linear")
    assert got == pytest.approx([0.5, 1.0, *[1 - k / 8 for k in range(8)]])


def test_cosine_decay_counts_every_optimizer_update():
    # 3 steps x 2 epochs x 2 mini-batches = 12 updates, no warm-up.
    got = factors(steps=3, epochs=2, mini_batches=2, micro_batch_size=2, schedule="cosine")
    assert got == pytest.approx([0.5 * (1 + math.cos(math.pi * k / 12)) for k in range(12)])


def test_constant_stays_at_the_base_lr():
    assert factors(steps=4, schedule="constant") == [1.0] * 4
