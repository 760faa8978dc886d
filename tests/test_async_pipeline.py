"""The asynchronous pipeline: alpha bounds staleness, workers split the batch, faults are contained."""

from __future__ import annotations

from pathlib import Path

import pytest

from cadence.config import load_config
from cadence.observe.metrics import read_jsonl
from cadence.recipes.train_rlvr import train
from cadence.rollout.worker import worker_quotas
from tests.quick_run import QUICK_RUN

QUICK = [*QUICK_RUN, "checkpoint.every=0"]


def records(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / "metrics.jsonl")


def test_worker_quotas_cover_the_batch():
    assert worker_quotas(16, 1) == [16]
    assert worker_quotas(10, 4) == [3, 3, 2, 2]
    assert sum(worker_quotas(7, 3)) == 7


@pytest.mark.slow
@pytest.mark.parametrize("alpha", [0, 2])
def test_inline_staleness_never_exceeds_alpha(alpha, tmp_path):
    cfg = load_config(None, [*QUICK, "trainer.steps=8", f"rollout.async_ratio={alpha}", f"logging.run_dir={tmp_path}"])
    rs = records(train(cfg).run_dir)
    assert [r["step"] for r in rs] == list(range(1, 9))
    staleness = [r["train/staleness_max"] for r in rs]
    assert max(staleness) <= alpha
    if alpha == 0:
        assert all(r["train/staleness_mean"] == 0 for r in rs)
    else:
        # The worker starts (alpha + 1) batches of groups on the first weights, and the trainer
        # takes the oldest first: from the second step on it trains on groups a version behind.
        assert staleness[0] == 0 and all(s >= 1 for s in staleness[1:])
        assert max(staleness) == alpha  # ... and, with the long tail, at some step the full alpha


@pytest.mark.slow
def test_reward_function_that_raises_is_contained(tmp_path):
    f = tmp_path / "flaky.py"
    f.write_text(
        "def reward(prompt, response):\n"
        "    if response.strip().endswith('7'):\n"
        "        raise ValueError('boom')\n"
        "    return 1.0 if response.strip() == prompt.answer else 0.0\n"
    )
    cfg = load_config(None, [*QUICK, "trainer.steps=3", f"reward.name=python:{f}:reward", f"logging.run_dir={tmp_path}/run"])
    rs = records(train(cfg).run_dir)
    assert len(rs) == 3
    assert sum(r["reward/errors"] for r in rs) > 0  # counted, scored 0, run carried on


@pytest.mark.slow
def test_ray_runtime_with_two_workers_and_alpha(tmp_path):
    ray = pytest.importorskip("ray")
    cfg = load_config(
        None,
        [*QUICK, "trainer.steps=6", "runtime.kind=ray", "runtime.rollout_workers=2", "runtime.rollout_cpus=0.5",
         "rollout.async_ratio=1", f"logging.run_dir={tmp_path}"],
    )
    try:
        rs = records(train(cfg).run_dir)
    finally:
        ray.shutdown()
    assert [r["step"] for r in rs] == list(range(1, 7))
    assert max(r["train/staleness_max"] for r in rs) <= 1
    assert all(r["progress/samples_total"] == 16 * r["step"] for r in rs)


def test_dynamic_filter_drops_groups_without_signal():
    from cadence.rollout.rlvr import keeps
    from cadence.rollout.sample import Group, Sample

    def group(rewards):
        g = Group(group_id=0, prompt_id="p")
        g.samples = [Sample("p", 0, [1], [2], [-0.1], r, 0, "stop") for r in rewards]
        return g

    assert not keeps(group([1, 1, 1, 1]), 0.0, None, None)
    assert not keeps(group([0, 0, 0, 0]), 0.0, None, None)
    assert keeps(group([0, 1, 0, 0]), 0.0, None, None)
    assert keeps(group([1, 1, 1, 1]), None, None, None)


@pytest.mark.slow
def test_filtered_run_keeps_full_batches(tmp_path):
    cfg = load_config(
        None,
        [*QUICK, "trainer.steps=4", "rollout.filter_min_std=0", "rollout.extra_prompts=2",
         "rollout.async_ratio=1", f"logging.run_dir={tmp_path}"],
    )
    rs = records(train(cfg).run_dir)
    assert all(r["progress/samples_total"] == 16 * r["step"] for r in rs)
    assert all(r["reward/std"] > 0 for r in rs)  # every trained group carried signal
    assert rs[-1]["rollout/filtered_groups_total"] > 0  # the built-in model solves many prompts outright


@pytest.mark.slow
def test_asyppo_critics_in_their_own_ray_actor(tmp_path):
    ray = pytest.importorskip("ray")
    cfg = load_config(
        None,
        [*QUICK, "trainer.steps=2", "runtime.kind=ray", "runtime.critic_actor=true", "runtime.critic_cpus=0.5",
         "runtime.rollout_cpus=0.5", "algorithm.name=asyppo", f"logging.run_dir={tmp_path}"],
    )
    try:
        rs = records(train(cfg).run_dir)
    finally:
        ray.shutdown()
    assert [r["step"] for r in rs] == [1, 2]
    assert "critic/value_loss_1" in rs[-1] and "asyppo/adv_masked_fraction" in rs[-1]


@pytest.mark.slow
def test_attention_credit_in_its_own_ray_actor(tmp_path):
    ray = pytest.importorskip("ray")
    common = [*QUICK, "trainer.steps=2", "runtime.kind=ray", "runtime.rollout_cpus=0.5", "algorithm.credit=local"]
    local = records(train(load_config(None, [*common, f"logging.run_dir={tmp_path}/local"])).run_dir)
    try:
        remote = records(
            train(
                load_config(
                    None,
                    [*common, "runtime.credit_actor=true", "runtime.credit_cpus=0.5", f"logging.run_dir={tmp_path}/remote"],
                )
            ).run_dir
        )
    finally:
        ray.shutdown()
    assert [r["step"] for r in remote] == [1, 2]
    assert remote[-1]["rhythm/attention_seconds"] > 0
    assert 0 < remote[-1]["rhythm/amplified_frac"] <= 1
    assert set(local[-1]) == set(remote[-1])  # the same metrics, wherever actor_attn lives


def test_credit_actor_needs_ray_and_a_credit():
    from cadence.config import ConfigError

    with pytest.raises(ConfigError, match="runtime.credit_actor"):
        load_config(None, ["runtime.credit_actor=true", "algorithm.credit=local"])
    with pytest.raises(ConfigError, match="algorithm.credit=local"):
        load_config(None, ["runtime.kind=ray", "runtime.credit_actor=true"])
