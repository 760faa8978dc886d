"""Every policy loss and advantage estimator runs end to end from the config (2 steps each)."""

from __future__ import annotations

import json

import pytest

from cadence.algo import advantages, losses
from cadence.config import load_config
from cadence.recipes.train_rlvr import train
from tests.quick_run import QUICK_RUN

pytestmark = pytest.mark.slow

FAST = ["trainer.steps=2", *QUICK_RUN]


@pytest.mark.parametrize("loss", losses.names())
def test_every_loss_trains_the_default_model(loss, tmp_path):
    cfg = load_config(None, [*FAST, f"algorithm.loss={loss}", f"logging.run_dir={tmp_path}"])
    summary = train(cfg)
    records = [json.loads(x) for x in (summary.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["train/grad_norm"] == r["train/grad_norm"] for r in records)  # not NaN


@pytest.mark.parametrize("estimator", [a for a in advantages.names() if not advantages.spec(a).needs_values])
def test_every_critic_free_advantage_trains(estimator, tmp_path):
    cfg = load_config(None, [*FAST, f"algorithm.advantage={estimator}", f"logging.run_dir={tmp_path}"])
    train(cfg)


def test_kl_as_loss_and_as_reward(tmp_path):
    for mode, estimator in (("loss", "grpo"), ("reward", "reinforce_plus_plus")):
        cfg = load_config(
            None,
            [*FAST, "algorithm.kl.coef=0.1", f"algorithm.kl.mode={mode}", f"algorithm.advantage={estimator}",
             f"logging.run_dir={tmp_path / mode}"],
        )
        summary = train(cfg)
        record = json.loads((summary.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
        assert ("train/kl_ref" in record) == (mode == "loss")


@pytest.mark.parametrize("name", ["ppo", "asyppo"])
def test_critic_algorithms_train_and_log_critic_metrics(name, tmp_path):
    cfg = load_config(None, [*FAST, f"algorithm.name={name}", f"logging.run_dir={tmp_path}"])
    summary = train(cfg)
    record = json.loads((summary.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert "critic/value_loss_0" in record and "critic/disagreement" in record
    if name == "asyppo":
        assert "critic/value_loss_1" in record
        assert 0.1 < record["asyppo/adv_masked_fraction"] < 0.3


@pytest.mark.parametrize("credit", ["local", "global", "coupled"])
def test_attention_credit_trains(credit, tmp_path):
    cfg = load_config(None, [*FAST, f"algorithm.credit={credit}", f"logging.run_dir={tmp_path}"])
    summary = train(cfg)
    record = json.loads((summary.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert "rhythm/amplified_frac" in record and record["rhythm/gamma_mean"] >= 1.0
