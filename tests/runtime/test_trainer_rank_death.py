"""A trainer rank that dies mid-run fails the step with one clear error (the supervisor then
resumes the run from its last checkpoint; see test_supervisor.py)."""

from __future__ import annotations

import os
import signal

import pytest

from cadence.algo.config import AlgorithmConfig
from cadence.config import TrainerConfig
from cadence.runtime.trainer_group import TrainerRankError
from tests.test_dp_trainer import make_groups, start_group


@pytest.mark.slow
def test_killed_rank_fails_the_step_with_a_clear_error():
    cfg = TrainerConfig(lr=1e-2, micro_batch_size=2, micro_batch_tokens=None)
    group = start_group(cfg, AlgorithmConfig())
    try:
        group.step(make_groups(0))
        os.kill(group.ranks[1].proc.pid, signal.SIGKILL)
        group.ranks[1].proc.join(timeout=10)
        with pytest.raises(TrainerRankError, match=r"trainer rank 1 of 2 died .*resume from the last checkpoint"):
            group.step(make_groups(1))
    finally:
        group.close()
