"""An asynchronous run whose loss corrects nothing for staleness says so once, at start."""

from __future__ import annotations

import pytest

from cadence.config import load_config
from cadence.recipes.train_rlvr import train
from tests.quick_run import QUICK_RUN

NOTE = "does not correct for staleness"


@pytest.mark.parametrize(
    ("overrides", "noted"),
    [
        (["rollout.async_ratio=1", "algorithm.mismatch.mode=none"], True),
        (["rollout.async_ratio=1"], False),  # grpo's default mu weight corrects it
        (["rollout.async_ratio=1", "algorithm.loss=tis"], False),
        (["rollout.async_ratio=0", "algorithm.mismatch.mode=none"], False),  # nothing is stale
    ],
)
def test_uncorrected_async_run_is_noted_once(overrides, noted, tmp_path, capsys):
    cfg = load_config(None, [*QUICK_RUN, "trainer.steps=1", f"logging.run_dir={tmp_path}/run", *overrides])
    train(cfg)
    assert capsys.readouterr().out.count(NOTE) == (1 if noted else 0)
