"""The built-in "chain" task: worked answers, long-tailed lengths, disjoint splits, errors."""

from __future__ import annotations

import statistics

import pytest
from pydantic import ValidationError

from cadence.config import RunConfig, load_config
from cadence.data.build import build_task
from cadence.data.chain import AdditionChainTask, chain_answer
from cadence.data.config import TaskConfig
from cadence.data.tasks import Prompt
from cadence.recipes.sft import length_buckets
from cadence.rewards.build import build_reward


def test_chain_answer_by_hand():
    assert chain_answer(37, 8) == (
        "45, 45+08=53, 53+08=61, 61+08=69, 69+08=77, 77+08=85, 85+08=93, 93+08=101\n",
        101,
    )
    assert chain_answer(96, 4) == ("100\n", 100)  # one step when a + b already reaches 100
    assert chain_answer(0, 50) == ("50, 50+50=100\n", 100)


def test_chain_prompts_are_deterministic_and_splits_disjoint():
    task = build_task(TaskConfig(name="chain"))
    assert isinstance(task, AdditionChainTask)
    assert task.prompts("train", 40, 1) == build_task(TaskConfig(name="chain")).prompts("train", 40, 1)
    test = task.prompts("test", 500)
    assert len(test) == 200
    held_out = {p.text for p in test}
    assert not held_out & {p.text for p in task.prompts("train", 3000)}
    assert not held_out & {p for p, _ in task.sft_examples(3000)}
    for p in task.prompts("train", 200):
        a, b = p.meta["a"], p.meta["b"]
        assert p.text == f"{a:02d}+{b:02d}=" and 3 <= b <= 40
        assert int(p.answer) == chain_answer(a, b)[1] >= 100


def test_chain_answers_are_long_tailed():
    lengths = [len(answer) for _, answer in build_task(TaskConfig(name="chain")).sft_examples(4000)]
    median = statistics.median(lengths)
    assert 15 <= median <= 40
    assert max(lengths) >= 10 * median  # the tail the async pipeline is built for


def test_chain_gold_answer_scores_one_with_the_default_reward():
    cfg = load_config(None, ["task.name=chain"])
    task = build_task(cfg.task)
    reward = build_reward(cfg.reward, task)
    for p in task.prompts("train", 50):
        worked, _ = chain_answer(p.meta["a"], p.meta["b"])
        assert reward(p, worked) == 1.0
    wrong = Prompt(id="y", text="37+08=", answer="101")
    assert reward(wrong, "45, 45+08=53, 53+08=61, 61+08=69, 69+08=77, 77+08=85, 85+08=93, 93+08=100") == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"step_min": 9, "step_max": 5}, "must not exceed step_max"),
        ({"step_min": 0}, "task.kwargs.step_min"),
        ({"steps": 3}, "task.kwargs.steps"),
    ],
)
def test_chain_config_errors(kwargs, message):
    with pytest.raises(ValidationError, match=message):
        TaskConfig(name="chain", kwargs=kwargs)


def test_chain_test_size_must_leave_training_problems():
    with pytest.raises(ValidationError, match="more than half"):
        RunConfig.model_validate({"task": {"name": "chain", "kwargs": {"step_min": 40}, "test_size": 80}})


def test_length_buckets_group_similar_lengths():
    rows = [([0] * n, 1) for n in (9, 1, 5, 3, 7, 2)]
    buckets = length_buckets(rows, 4)
    assert [[len(ids) for ids, _ in b] for b in buckets] == [[1, 2, 3, 5], [7, 9]]


def test_chain_gets_a_token_budget_that_fits_its_answers_unless_one_is_set():
    cfg = load_config(None, ["task.name=chain"])
    assert cfg.rollout.max_new_tokens == 334 == len(chain_answer(0, 3)[0])  # 0, 3, 6, ..., 102
    assert cfg.algorithm.max_response_length == 334  # Dr. GRPO's constant follows it
    assert load_config(None, ["task.name=chain", "task.kwargs.step_min=10"]).rollout.max_new_tokens == 94
    assert load_config(None, ["task.name=chain", "rollout.max_new_tokens=16"]).rollout.max_new_tokens == 16
    assert load_config(None, []).rollout.max_new_tokens == 8
    with pytest.raises(Exception, match="task.kwargs.step_min"):
        load_config(None, ["task.name=chain", "task.kwargs.step_min=0"])
