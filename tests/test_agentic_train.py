"""`cadence train` with an env section: the agentic pipeline end to end, sync and async."""

from __future__ import annotations

import pytest

from cadence.config import load_config
from cadence.observe.metrics import read_jsonl
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
    records = read_jsonl(summary.run_dir / "metrics.jsonl")
    steps = [r for r in records if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2, 3]
    last = steps[-1]
    # 4 groups of 4 episodes a step, each one sample; the run counted them.
    assert last["progress/samples_total"] == 3 * 16
    assert last["rollout/episodes_total"] >= 3 * 16
    assert 1 <= last["rollout/turns_per_episode"] <= 2
    assert max(r["train/staleness_max"] for r in steps) <= alpha
    assert (summary.run_dir / "checkpoints" / "step_3").exists()


QUICK_AGENT = [
    *QUICK_RUN, "env.name=python:tests/agentic_envs.py:Parity", "env.action_tag=null", "env.max_turns=2",
    "rollout.max_new_tokens=3", "eval.before=false", "eval.after=false", "trainer.steps=2",
]


@pytest.mark.parametrize(
    "overrides",
    [
        [f"algorithm.loss={loss}"] for loss in
        ("ppo", "dr_grpo", "gspo", "decoupled_ppo", "tis", "cispo", "topr", "reinforce")
    ] + [
        ["algorithm.name=asyppo"],
        ["algorithm.credit=coupled"],
        ["algorithm.advantage=rloo", "algorithm.kl.coef=0.05"],
    ],
    ids=lambda o: ",".join(o),
)
def test_every_loss_asyppo_and_rhythm_credit_train_on_episodes(overrides, tmp_path):
    cfg = load_config(None, [*QUICK_AGENT, "rollout.async_ratio=1", f"logging.run_dir={tmp_path}/run", *overrides])
    summary = train(cfg)
    steps = read_jsonl(summary.run_dir / "metrics.jsonl")
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["train/grad_norm"] > 0 for r in steps)  # the model's tokens carried gradient


def test_an_agentic_run_resumes_from_its_checkpoint(tmp_path):
    run = [*QUICK_AGENT, "checkpoint.every=1", f"logging.run_dir={tmp_path}/run"]
    train(load_config(None, [*run, "trainer.steps=1"]))
    summary = train(load_config(None, [*run, "trainer.steps=2"]), resume=True, allow_change=["trainer.steps"])
    steps = read_jsonl(summary.run_dir / "metrics.jsonl")
    assert [r["step"] for r in steps] == [1, 2]
    assert (summary.run_dir / "checkpoints" / "step_2").exists()


@pytest.mark.slow
def test_episodes_run_in_ray_rollout_workers(tmp_path):
    cfg = load_config(None, [*QUICK_AGENT, "runtime.kind=ray", "runtime.rollout_workers=2",
                             "rollout.async_ratio=1", f"logging.run_dir={tmp_path}/run"])
    summary = train(cfg)
    steps = read_jsonl(summary.run_dir / "metrics.jsonl")
    assert [r["step"] for r in steps] == [1, 2]
    assert steps[-1]["rollout/episodes_total"] >= 32  # both workers' episodes, summed
