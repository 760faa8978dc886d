"""A rollout worker actor that dies between calls is replaced and given its state back: the
newest weights (its answers carry their version) and its prompt position (no prompt trained on
is generated again), and the replacement is recorded in restarts.jsonl."""

from __future__ import annotations

import pytest

from cadence.config import load_config
from cadence.models.loading import load_policy
from cadence.observe.metrics import read_jsonl
from tests.quick_run import QUICK_RUN


@pytest.fixture
def local_ray():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_dead_worker_comes_back_with_weights_and_prompt_position(local_ray, tmp_path):
    from cadence.assemble import rollout_workers

    cfg = load_config(None, [*QUICK_RUN, "trainer.steps=6", "runtime.kind=ray", "runtime.rollout_cpus=1",
                             "rollout.async_ratio=0", "logging.events=false", f"logging.run_dir={tmp_path}"])
    weights = load_policy(cfg.model.path).state_dict()
    group = rollout_workers(cfg)
    try:
        group.start()
        seen = [g.prompt_id for g in group.get_batch(0)]
        group.update_weights(weights, 1)
        seen += [g.prompt_id for g in group.get_batch(1)]
        group.update_weights(weights, 2)
        local_ray.kill(group.workers[0].actor)  # dead between two calls, as after a node loss
        after = group.get_batch(2)
        assert group.restarts == 1
        assert {s.version for g in after for s in g.samples} == {2}  # generated on the pushed weights
        assert not {g.prompt_id for g in after} & set(seen)  # the prompt stream went on
        assert group.state_dict()[0]["swaps"] == 2  # admission clock: one push per step, as before
    finally:
        group.close()
    (entry,) = read_jsonl(tmp_path / "restarts.jsonl")
    assert entry["role"] == "rollout" and entry["worker"] == 0 and "get_batch" in entry["cause"]
