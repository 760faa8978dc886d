"""Every policy loss, advantage estimator, KL mode and credit rule trains end to end from the
config, and every update moves the policy the way the rewards say.

The check that a run learned is taken on each update's own batch: the trainer's `step` is
wrapped to measure, per sample, how the update changed log pi(response | prompt). A correct
policy gradient raises the answers that beat their group's mean reward relative to the ones
that fell short (the first Adam step does so by a wide margin: about 1 nat here); a loss with
the wrong sign, a ratio upside down or advantages that ignore the reward does not.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from cadence.algo import advantages, kl, losses
from cadence.algo.config import AlgorithmConfig
from cadence.config import load_config
from cadence.observe.metrics import read_jsonl
from cadence.recipes.train_rlvr import train
from cadence.train.batch import collate, flatten
from cadence.train.logprobs import batched_logprobs
from cadence.train.trainer import PolicyTrainer
from tests.quick_run import QUICK_RUN

pytestmark = pytest.mark.slow

FAST = ["trainer.steps=2", *QUICK_RUN]


@dataclass
class Update:
    rewards: torch.Tensor  # [B]
    group_ids: torch.Tensor  # [B]
    lengths: torch.Tensor  # [B] response tokens
    change: torch.Tensor  # [B] log pi(response) after the update minus before


def _response_logprob(policy, batch, temperature: float) -> torch.Tensor:
    was_training = policy.training
    policy.eval()  # no dropout: before and after must differ by the update alone
    lp = batched_logprobs(policy, batch.input_ids, batch.attention_mask, temperature, micro=64)
    policy.train(was_training)
    return (lp * batch.mask).sum(1)


@pytest.fixture
def updates(monkeypatch) -> list[Update]:
    """Every trainer step of the test's runs, measured on the batch it learned from."""
    seen: list[Update] = []
    step = PolicyTrainer.step

    def measured(self, groups):
        batch = collate(flatten(groups), self.pad_id)
        before = _response_logprob(self.policy, batch, self.temperature)
        metrics = step(self, groups)
        after = _response_logprob(self.policy, batch, self.temperature)
        seen.append(Update(batch.rewards, batch.group_ids, batch.mask.sum(1), after - before))
        return metrics

    monkeypatch.setattr(PolicyTrainer, "step", measured)
    return seen


def improvement(u: Update) -> float | None:
    """sum_i (r_i - mean reward of i's group) x change_i; None when no group has two rewards."""
    centred = torch.zeros_like(u.rewards)
    for gid in u.group_ids.unique():
        rows = u.group_ids == gid
        centred[rows] = u.rewards[rows] - u.rewards[rows].mean()
    if not centred.abs().max() > 0:
        return None
    return float((centred * u.change).sum())


def assert_moves_towards_reward(seen: list[Update], steps: int) -> None:
    assert len(seen) == steps
    signal = [improvement(u) for u in seen]
    assert any(s is not None for s in signal), "no step had a group with differing rewards"
    assert all(s > 0 for s in signal if s is not None), f"updates against the reward: {signal}"


def records(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / "metrics.jsonl")


@pytest.mark.parametrize("loss", losses.names())
def test_every_loss_moves_the_policy_towards_rewarded_answers(loss, tmp_path, updates):
    # alpha = 1: from step 2 on some samples are a version old, so the off-policy
    # corrections (pi_old / mu) are part of what is checked.
    cfg = load_config(
        None,
        [*QUICK_RUN, "trainer.steps=3", "rollout.async_ratio=1", f"algorithm.loss={loss}",
         f"logging.run_dir={tmp_path}"],
    )
    rs = records(train(cfg).run_dir)
    assert [r["step"] for r in rs] == [1, 2, 3]
    assert max(r["train/staleness_max"] for r in rs) == 1
    assert_moves_towards_reward(updates, steps=3)


# grpo, the default advantage, is every loss run's above: not trained again here.
@pytest.mark.parametrize("estimator", [a for a in advantages.names() if not advantages.spec(a).needs_values
                                       and a != AlgorithmConfig().advantage])
def test_every_critic_free_advantage_moves_the_policy_towards_rewarded_answers(estimator, tmp_path, updates):
    cfg = load_config(None, [*FAST, f"algorithm.advantage={estimator}", f"logging.run_dir={tmp_path}"])
    train(cfg)
    assert_moves_towards_reward(updates, steps=2)


def test_kl_as_loss_is_zero_at_the_reference_and_grows_as_the_policy_leaves_it(tmp_path, updates):
    cfg = load_config(
        None, [*FAST, "algorithm.kl.coef=0.1", "algorithm.kl.mode=loss", f"logging.run_dir={tmp_path}"]
    )
    rs = records(train(cfg).run_dir)
    # Step 1 trains the starting policy, which is the reference: KL exactly 0. Step 2's policy
    # has moved (k3 >= 0, > 0 once they differ).
    assert abs(rs[0]["train/kl_ref"]) < 1e-7
    assert rs[1]["train/kl_ref"] > 1e-4
    assert_moves_towards_reward(updates, steps=2)


def test_kl_as_reward_penalises_only_a_policy_that_left_the_reference(tmp_path, updates, monkeypatch):
    penalties: list[torch.Tensor] = []
    penalty = kl.kl_reward_penalty

    def recorded(logprobs, ref_logprobs, mask, cfg):
        out = penalty(logprobs, ref_logprobs, mask, cfg)
        # Independently: coef x k3(log pi_ref - log pi) on response tokens.
        d = (ref_logprobs - logprobs).double()
        assert torch.allclose(out.double(), 0.1 * (d.exp() - d - 1) * mask, atol=1e-7)
        penalties.append(out)
        return out

    monkeypatch.setattr(kl, "kl_reward_penalty", recorded)
    cfg = load_config(
        None,
        [*FAST, "algorithm.kl.coef=0.1", "algorithm.kl.mode=reward", "algorithm.advantage=reinforce_plus_plus",
         f"logging.run_dir={tmp_path}"],
    )
    rs = records(train(cfg).run_dir)
    assert "train/kl_ref" not in rs[-1]  # a reward, not a loss term
    assert len(penalties) == 2  # shaped every step
    # Step 1 samples from the reference itself (engine and trainer agree to float noise);
    # step 2's policy has moved, by ~0.02 nats a token here: penalties of ~1e-5.
    assert penalties[0].abs().max() < 1e-8, penalties[0].abs().max()
    assert penalties[1].min() >= 0 and penalties[1].max() > 1e-6
    assert_moves_towards_reward(updates, steps=2)


@pytest.mark.parametrize("name", ["ppo", "asyppo"])
def test_critic_algorithms_train_and_log_critic_metrics(name, tmp_path):
    cfg = load_config(None, [*FAST, f"algorithm.name={name}", f"logging.run_dir={tmp_path}"])
    summary = train(cfg)
    record = json.loads((summary.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert "critic/value_loss_0" in record and "critic/disagreement" in record
    if name == "asyppo":
        assert "critic/value_loss_1" in record
        assert 0.1 < record["asyppo/adv_masked_fraction"] < 0.3


# The arithmetic answers are a few tokens long: the FAI horizon (10..100 tokens back by
# default) would select nothing, so it is shortened to what these responses span.
CREDIT = [*FAST, "algorithm.rhythm.fai_min=1", "algorithm.rhythm.fai_max=4"]


@pytest.mark.parametrize("credit", ["local", "global"])
def test_attention_credit_amplifies_its_share_of_tokens(credit, tmp_path, updates):
    cfg = load_config(None, [*CREDIT, f"algorithm.credit={credit}", f"logging.run_dir={tmp_path}"])
    rs = records(train(cfg).run_dir)
    gamma_amp = cfg.algorithm.rhythm.gamma_amp
    for r, u in zip(rs, updates, strict=True):
        # At most ceil(top_q x R) tokens of each response are selected, and some are.
        most = sum(math.ceil(cfg.algorithm.rhythm.top_q * n - 1e-9) for n in u.lengths.tolist())
        assert 0 < r["rhythm/amplified_frac"] <= most / float(u.lengths.sum()) + 1e-6
        # A selected token's advantage is multiplied by gamma_amp, any other by 1.
        assert r["rhythm/gamma_mean"] == pytest.approx(1 + (gamma_amp - 1) * r["rhythm/amplified_frac"])
    assert_moves_towards_reward(updates, steps=2)


def test_coupled_credit_moves_amplification_between_tokens_without_adding_any(tmp_path, updates):
    # Same seed, same first batch: the coupled rule starts from the global anchors and hands
    # a share of some to their introducers, so the mean gamma is the global rule's.
    first = {}
    for credit in ("global", "coupled"):
        cfg = load_config(
            None, [*CREDIT, "trainer.steps=1", f"algorithm.credit={credit}", f"logging.run_dir={tmp_path / credit}"]
        )
        first[credit] = records(train(cfg).run_dir)[0]
    assert first["global"]["rhythm/gamma_mean"] > 1
    assert first["coupled"]["rhythm/gamma_mean"] == pytest.approx(first["global"]["rhythm/gamma_mean"], abs=1e-6)
    assert_moves_towards_reward(updates, steps=2)
