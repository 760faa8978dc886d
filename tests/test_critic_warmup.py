"""Critic warm-up trains only the critics: the policy's weights, and so its version, stay put."""

from __future__ import annotations

import torch

from cadence.algo.config import AlgorithmConfig
from cadence.config import TrainerConfig, load_config
from cadence.models.tiny import tiny_model
from cadence.observe.metrics import read_jsonl
from cadence.recipes.train_rlvr import train
from cadence.train.trainer import PolicyTrainer
from tests.quick_run import QUICK_RUN
from tests.test_trainer import make_groups


def test_warm_up_steps_change_neither_weights_nor_version():
    model = tiny_model(hidden_size=32, layers=1, heads=2)
    algo = AlgorithmConfig(name="asyppo", critic={"warmup_steps": 2, "critic_fraction": 0.5})
    trainer = PolicyTrainer(model, TrainerConfig(lr=1e-2, micro_batch_size=4), algo, 1.0, pad_id=0)
    from cadence.train.critics import CriticEnsemble

    trainer.critics = CriticEnsemble(algo.critic, model, "", 0, 4)
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(2):
        metrics = trainer.step(make_groups(version=0))
        assert "critic/value_loss_0" in metrics  # the critics did train
    assert trainer.version == 0 and trainer.steps == 2
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    trainer.step(make_groups(version=0))
    assert trainer.version == 1 and trainer.steps == 3
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    state = trainer.state_dict()
    assert (state["version"], state["steps"]) == (1, 3)


def test_a_warm_up_run_keeps_generating_and_tags_samples_with_unchanged_versions(tmp_path):
    """Admission runs on weight pushes, not versions, so warm-up steps neither stall rollout
    (a version-based gate would never open again) nor count as staleness."""
    cfg = load_config(None, [
        *QUICK_RUN, "trainer.steps=4", "algorithm.name=asyppo", "algorithm.critic.warmup_steps=2",
        "rollout.async_ratio=0", f"logging.run_dir={tmp_path}/run",
    ])
    summary = train(cfg)
    records = read_jsonl(summary.run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert max(r["train/staleness_max"] for r in records) == 0
    # Steps 1-2 trained only the critics (no policy loss); version 0 served all of them.
    assert all("train/pg_loss" not in r for r in records[:2])
    assert all("train/pg_loss" in r for r in records[2:])
