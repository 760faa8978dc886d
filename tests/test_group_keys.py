"""The worker's group keys: a resumed run plays every key not trained on, none twice, whatever the
producer (RLVR prompts, environment seeds, agent tasks), from this format or an older one."""

from __future__ import annotations

import pytest

from cadence.rollout.producer import GroupKeys
from cadence.yaml_config import ConfigError


def _resumed(state: dict, n: int = 3) -> list[int]:
    keys = GroupKeys()
    keys.load_state_dict(state)
    return [keys.take() for _ in range(n)]


def test_a_resumed_worker_owes_the_keys_not_trained_on_and_skips_the_trained_ones():
    keys = GroupKeys(first=10)
    assert [keys.take() for _ in range(5)] == [10, 11, 12, 13, 14]
    for key in (10, 11, 13):  # 12 and 14 were in flight, in the buffer or dropped
        keys.trained(key)
    state = keys.state_dict()
    assert state == {"trained_below": 12, "trained_above": [13]}
    assert _resumed({"keys": state}) == [12, 14, 15]


@pytest.mark.parametrize(("old", "resumed"), [
    ({"prompts": {"cursor": 5, "skip": [6]}}, [5, 7, 8]),  # RLVR's prompt cursor
    ({"next_key": 2, "skip": [3, 4]}, [2, 5, 6]),  # the agent producer's
    ({"next_seed": 1005}, [1005, 1006, 1007]),  # the episode producer's: what was started counted as trained
])
def test_checkpoints_of_earlier_releases_resume(old, resumed):
    assert _resumed({**old, "next_group_id": 9, "swaps": 2}) == resumed


def test_a_worker_state_without_keys_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="no group keys") as refused:
        _resumed({"swaps": 2})
    assert "\n" not in str(refused.value) and "without --resume" in str(refused.value)


def test_a_resumed_episode_run_replays_the_seeds_it_never_trained_on():
    """Episodes used to resume after the last seed started: groups in flight or waiting in the
    buffer when the checkpoint was written were never trained on, and never played again."""
    from cadence.assemble import ConfiguredRolloutWorker
    from cadence.config import load_config

    cfg = load_config(None, [
        "env.name=python:tests/agentic_envs.py:Parity", "env.action_tag=null", "env.max_turns=2",
        "rollout.extra_groups=2", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=3",
        "rollout.engine.backend=mock", "rollout.engine.mock.vocab_size=256", "rollout.engine.mock.median_tokens=3",
    ])

    def recording(worker) -> list[int]:
        played, play = [], worker.producer.play

        async def record(key: int, group_id: int):
            played.append(key)
            return await play(key, group_id)

        worker.producer.play = record
        return played

    first = ConfiguredRolloutWorker(cfg)
    try:
        started = recording(first)
        trained = {int(g.prompt_id.removeprefix("seed")) for g in first.get_batch(0, timeout=120)}
        state = first.state_dict()
    finally:
        first.close()
    assert len(started) == 4 and len(trained) == 2  # 2 trained, 2 more in flight or in the buffer
    resumed = ConfiguredRolloutWorker(cfg)
    try:
        resumed.load_state_dict(state, version=0)  # no weights were pushed: still version 0
        replayed = recording(resumed)
        resumed.get_batch(0, timeout=120)
    finally:
        resumed.close()
    owed = sorted(set(started) - trained)
    assert sorted(replayed) == owed + [max(started) + 1, max(started) + 2]
