"""The simulated worker is cadence's RolloutWorker with another constructor: when the real
constructor gains a field, the inherited scheduling methods may need it here too."""

from __future__ import annotations

from cadence.config import load_config
from cadence.inference.mock import MockEngine
from cadence.rollout.worker import RolloutWorker
from cadence.simulate.worker import SimRolloutWorker

# What a real worker loads for training and evaluation, and the simulator has no use for.
NOT_SIMULATED = {"threads", "cfg", "tokenizer", "task", "eval_params"}


def test_the_simulated_worker_sets_every_field_of_a_real_one():
    real = RolloutWorker(load_config(None, ["rollout.engine.backend=mock"]), background=False)
    try:
        sim = SimRolloutWorker(0, [MockEngine(virtual_clock=True, step_latency_s=0.5)], quota=2, group_size=2, alpha=1,
                               prompt_ticks=4, max_ticks=8)
        missing = set(vars(real)) - set(vars(sim)) - NOT_SIMULATED
        assert not missing, f"SimRolloutWorker.__init__ lacks {sorted(missing)}: set them as the real one does"
        busy, seconds = sim.step()  # admits alpha + 1 quotas of groups, one engine step
        assert busy and seconds == 0.5
        assert sim.started_groups == (1 + 1) * 2
    finally:
        real.close()
