"""A simulated run: alpha bounds staleness, sync is staleness-free, runs repeat exactly."""

from __future__ import annotations

import pytest

from cadence.config import ConfigError
from cadence.simulate.cluster import layout
from cadence.simulate.config import load_sim_config
from cadence.simulate.sim import simulate

SMALL = ["cluster.gpus=12", "workload.prompts_per_step=12", "workload.group_size=4", "workload.median_tokens=512",
         "workload.max_tokens=4096", "run.steps=3", "run.warmup_steps=2"]


def test_alpha_bounds_staleness_and_sync_has_none():
    for a in (1, 3):
        result = simulate(load_sim_config(None, None, [*SMALL, f"cluster.alpha={a}", "cluster.train_gpus=4"]))
        assert max(s.staleness_mean for s in result.steps) <= a
        assert result.rollout_gpus == 8 and result.train_gpus == 4
    sync = simulate(load_sim_config(None, None, [*SMALL, "cluster.alpha=0", "cluster.colocate=true"]))
    assert all(s.staleness_mean == 0 for s in sync.steps)
    assert sync.rollout_gpus == sync.train_gpus == 12
    assert [s.samples for s in sync.steps] == [48] * 5  # every step a full batch


def test_a_run_repeats_exactly_and_the_seed_matters():
    one = simulate(load_sim_config(None, None, SMALL))
    assert simulate(load_sim_config(None, None, SMALL)).samples_per_s == one.samples_per_s
    other = simulate(load_sim_config(None, None, [*SMALL, "run.seed=1"]))
    assert other.samples_per_s != one.samples_per_s


def test_layout_cuts_workers_by_node_and_shares_prompts_by_replica():
    cfg = load_sim_config(None, None, ["cluster.gpus=40", "cluster.train_gpus=20", "workload.prompts_per_step=10"])
    lay = layout(cfg)
    assert lay.replicas_per_worker == [8, 8, 4] and sum(lay.quotas) == 10 and lay.quotas[2] == 2


def test_bad_settings_are_named():
    with pytest.raises(ConfigError, match="cluster"):
        load_sim_config(None, None, ["cluster.colocate=true", "cluster.alpha=2"])
    with pytest.raises(ConfigError, match="workload.sigmaa: unknown key"):
        load_sim_config(None, None, ["workload.sigmaa=1"])
    with pytest.raises(ConfigError, match="unknown preset"):
        load_sim_config("qwen9", None, [])


def test_a_config_file_goes_over_the_preset_and_overrides_over_both(tmp_path):
    file = tmp_path / "mine.yaml"
    file.write_text("cluster: {gpus: 64}\nworkload: {median_tokens: 1000}\n")
    cfg = load_sim_config("qwen3-8b-think", file, ["workload.median_tokens=2000"])
    assert cfg.cluster.gpus == 64 and cfg.cluster.alpha == 2  # file over preset, the rest kept
    assert cfg.workload.median_tokens == 2000 and cfg.workload.max_tokens == 32768
