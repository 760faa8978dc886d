"""`cadence train` with an env section: the agentic pipeline end to end, sync and async."""

from __future__ import annotations

import json

import pytest

from cadence.config import load_config
from cadence.recipes.train_rlvr import train
from tests.quick_run import QUICK_RUN

GUESS = [
    "env.name=python:examples/envs/guess_number.py:GuessNumber", "env.kwargs.high=4", "env.max_turns=2",
    "env.action_tag=null", "rollout.max_new_tokens=3", "eval.episodes=4", "eval.before=true",
    "eval.after=true",
]


@pytest.mark.parametrize("alpha", [0, 1])
def test_a_user_environment_trains_with_env_name_and_nothing_else(alpha, tmp_path):
    cfg = load_config(None, [*QUICK_RUN, *GUESS, "trainer.steps=3", f"rollout.async_ratio={alpha}",
                             f"logging.run_dir={tmp_path}/run"])
    summary = train(cfg)
    assert summary.eval_before is not None and summary.eval_after is not None
    assert summary.eval_before.prompts == 4
    records = [json.loads(x) for x in (summary.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2, 3]
    last = steps[-1]
    # 4 groups of 4 episodes a step, each one sample; the run counted them.
    assert last["progress/samples_total"] == 3 * 16
    assert last["rollout/episodes_total"] >= 3 * 16
    assert 1 <= last["rollout/turns_per_episode"] <= 2
    assert max(r["train/staleness_max"] for r in steps) <= alpha
    assert (summary.run_dir / "checkpoints" / "step_3").exists()
