"""Per-turn advantages and chat-template turns in agentic runs: the trainer hands each turn's
reward to the per-turn estimators, and `cadence train` runs a few steps with each new mode."""

from __future__ import annotations

import pytest
import torch

from cadence.algo.config import AlgorithmConfig
from cadence.assemble import ConfiguredRolloutWorker
from cadence.config import ConfigError, TrainerConfig, load_config
from cadence.models.tiny import tiny_model
from cadence.observe.metrics import read_jsonl
from cadence.recipes.train_rlvr import train
from cadence.rollout.sample import Group, Sample
from cadence.rollout.turns import ChatTurns
from cadence.train.batch import collate
from cadence.train.trainer import PolicyTrainer
from tests.chat_models import save_chat_model
from tests.test_agentic_train import QUICK_AGENT


def _episode(response: list[int], loss_mask: list[int], token_rewards: list[float]) -> Sample:
    return Sample("seed1", 0, [1, 10], response, [-1.0] * len(response), sum(token_rewards), 0, "stop",
                  loss_mask=loss_mask, token_rewards=token_rewards)


def test_the_trainer_hands_each_turns_reward_to_a_per_turn_estimator():
    # Episode 1: turns [20, 21] (reward 0.5) and [22] (reward 1.0), gamma 1: G = [1.5, 1.0].
    # Episode 2: turns [20] and [21], no reward: G = [0, 0].
    # Pool {1.5, 1.0, 0, 0}: mean 0.625, unbiased std sqrt(1.6875 / 3) = 0.75.
    group = Group(0, "seed1", [
        _episode([20, 21, 30, 22], [1, 1, 0, 1], [0.0, 0.5, 0.0, 1.0]),
        _episode([20, 30, 21], [1, 0, 1], [0.0, 0.0, 0.0]),
    ])
    trainer = PolicyTrainer(tiny_model(hidden_size=32, layers=1, heads=2), TrainerConfig(micro_batch_size=4),
                            AlgorithmConfig(advantage="turn_grpo"), temperature=1.0, pad_id=0)
    advantages, _, _ = trainer._advantages(collate(group.samples, pad_id=0), None, None)
    a, b, c = 0.875 / 0.75, 0.375 / 0.75, -0.625 / 0.75
    assert torch.allclose(advantages[0, 1:5], torch.tensor([a, a, 0.0, b]), atol=1e-5)  # response from p - 1 = 1
    assert torch.allclose(advantages[1, 1:4], torch.tensor([c, 0.0, c]), atol=1e-5)


def _steps(summary) -> list[dict]:
    return read_jsonl(summary.run_dir / "metrics.jsonl")


@pytest.mark.parametrize(
    "overrides", [["algorithm.advantage=turn_grpo", "algorithm.gamma=0.9"], ["algorithm.name=ppo"]],
    ids=["turn_grpo", "ppo-gae-per-turn"],
)
def test_per_turn_advantages_train_on_episodes(overrides, tmp_path):
    cfg = load_config(None, [*QUICK_AGENT, f"logging.run_dir={tmp_path}/run", *overrides])
    steps = _steps(train(cfg))
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["train/grad_norm"] > 0 for r in steps)


@pytest.fixture(scope="module")
def qwen2_chat_dir(tmp_path_factory) -> str:
    return save_chat_model(tmp_path_factory.mktemp("qwen2_chat"))


def test_a_chat_model_plays_in_chat_turns_and_trains(qwen2_chat_dir, tmp_path):
    run = [*QUICK_AGENT, f"model.path={qwen2_chat_dir}", f"logging.run_dir={tmp_path}/run",
           "env.system_prompt=Answer in one word.", "algorithm.advantage=turn_grpo"]
    worker = ConfiguredRolloutWorker(load_config(None, run))
    assert worker.producer.turns == ChatTurns("Answer in one word.")  # env.turn_format=auto found the template
    worker.close()
    steps = _steps(train(load_config(None, run)))
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["train/grad_norm"] > 0 for r in steps)


def test_a_chat_format_without_a_template_is_a_config_error():
    with pytest.raises(ConfigError, match="env.turn_format=chat: the model's tokenizer has no chat template"):
        load_config(None, [*QUICK_AGENT, "env.turn_format=chat"])  # the built-in model has none
