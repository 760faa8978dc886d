"""A run whose groups all have equal rewards in its first steps says so, in one line, naming the cause."""

from __future__ import annotations

from types import SimpleNamespace

from cadence.config import load_config
from cadence.observe.flat_rewards import FlatRewardWatch, flat_reward_cause
from cadence.recipes.train_rlvr import train
from tests.quick_run import QUICK_RUN


def _groups(*rewards: list[float]) -> list:
    return [SimpleNamespace(samples=[SimpleNamespace(reward=r) for r in group]) for group in rewards]


def test_the_cause_is_named_from_the_rewards():
    assert flat_reward_cause([[0.0, 1.0], [0.0, 0.0]]) is None  # one group differs: a signal
    assert "never produced an answer the reward accepts" in flat_reward_cause([[-0.4, -0.4], [-0.4, -0.4]])
    assert "already solves every prompt" in flat_reward_cause([[1.0, 1.0], [1.0, 1.0]])
    assert "rollout.temperature" in flat_reward_cause([[0.0, 0.0], [1.0, 1.0]])
    assert "does not tell the responses apart" in flat_reward_cause([[0.5, 0.5]])


def test_the_watch_warns_once_after_its_steps_and_not_after_a_signal():
    lines: list[str] = []
    watch = FlatRewardWatch(steps=3, echo=lines.append)
    flat = _groups([0.0, 0.0], [0.0, 0.0])
    assert [watch.update(flat) for _ in range(2)] == [None, None] and lines == []
    assert "first 3 steps" in watch.update(flat)
    watch.update(flat)
    assert len(lines) == 1 and "\n" not in lines[0]
    learning = FlatRewardWatch(steps=3, echo=lines.append)
    learning.update(_groups([0.0, 1.0]))
    for _ in range(3):
        learning.update(flat)
    assert len(lines) == 1  # a signal in the first steps: no warning


def test_a_run_that_never_earns_a_reward_warns_as_it_goes(tmp_path, capsys):
    reward = tmp_path / "never.py"
    reward.write_text("def reward(prompt, response):\n    return 0.0\n")
    cfg = load_config(None, [*QUICK_RUN, "trainer.steps=3", f"reward.name=python:{reward}:reward",
                             f"logging.run_dir={tmp_path / 'run'}"])
    train(cfg)
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if line.startswith("warning: no learning signal")]
    assert len(warnings) == 1 and "never produced an answer the reward accepts" in warnings[0], out
