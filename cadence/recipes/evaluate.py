"""`cadence eval`: held-out accuracy of one checkpoint on a task, or held-out success of its
episodes when the config names an environment or an agent (played by the rollout worker that
trains them, so evaluation and training see the same episodes)."""

from __future__ import annotations

import sys

from cadence.config import RunConfig
from cadence.data.build import build_task
from cadence.inference.build import build_engine
from cadence.inference.hub import InferenceHub
from cadence.inference.types import SamplingParams
from cadence.models.loading import frozen_copy, load_policy, load_tokenizer
from cadence.observe.reward_errors import RewardFunctionError, describe_failure, reward_broken
from cadence.rewards.build import build_reward
from cadence.rewards.guard import RewardGuard
from cadence.rollout.evaluate import EvalResult, evaluate
from cadence.rollout.render import PromptRenderer
from cadence.runtime.threads import configure_threads


def run_eval(cfg: RunConfig) -> EvalResult:
    if cfg.env is not None or cfg.agent is not None:
        return _eval_episodes(cfg)
    configure_threads(cfg.runtime.threads)
    tokenizer = load_tokenizer(cfg.model.path)
    render = PromptRenderer.for_task(cfg.task, tokenizer, cfg.model.path)  # before the weights load
    engine = build_engine(cfg.rollout.engine, frozen_copy(load_policy(cfg.model.path)), tokenizer)
    task = build_task(cfg.task)
    reward = RewardGuard(build_reward(cfg.reward, task), cfg.reward.timeout_s, cfg.reward.workers)
    stop = cfg.rollout.stop if cfg.rollout.stop is not None else list(task.stop)
    params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.eval.temperature, stop=stop,
                            stop_token_ids=render.stop_token_ids())
    try:
        result = evaluate(InferenceHub([engine]), render, task.prompts("test", cfg.task.test_size, cfg.seed), reward, params, cfg.eval.samples)
        stats = reward.stats()
    finally:
        reward.close()
    for kind, first in stats["first_failures"].items():
        print(describe_failure(kind, first, 0), file=sys.stderr)
    problem = reward_broken(stats, "on the held-out prompts")
    if problem:
        raise RewardFunctionError(problem)
    return result


def _eval_episodes(cfg: RunConfig) -> EvalResult:
    from cadence.assemble import ConfiguredRolloutWorker  # the composition root builds the producer

    worker = ConfiguredRolloutWorker(cfg, threads=cfg.runtime.threads, background=False)
    try:
        return worker.evaluate(cfg.eval.samples)
    finally:
        worker.close()
