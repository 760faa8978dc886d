"""`cadence eval`: held-out accuracy of one checkpoint on a task (pass@1, pass@k), or held-out
success of its episodes when the config names an environment or an agent. The rollout worker
that trains plays them (cadence/assemble.py), so evaluation and training see the same prompts,
chat template, stop rules and reward."""

from __future__ import annotations

import sys

from cadence.assemble import ConfiguredRolloutWorker
from cadence.config import RunConfig
from cadence.observe.reward_errors import RewardFunctionError, describe_failure, reward_broken
from cadence.rollout.evaluate import EvalResult
from cadence.rollout.producer import reward_health


def run_eval(cfg: RunConfig) -> EvalResult:
    """The checkpoint at `cfg.model.path` on the held-out prompts or episodes; a reward function
    that fails on (nearly) every held-out response raises `RewardFunctionError`."""
    # No pipeline timeline: a config naming a training run's folder would add spans to that run's.
    quiet = cfg.model_copy(update={"logging": cfg.logging.model_copy(update={"events": False})})
    worker = ConfiguredRolloutWorker(quiet, threads=cfg.runtime.threads, background=False)
    try:
        result = worker.evaluate(cfg.eval.samples)
        report = reward_health(worker.health())
    finally:
        worker.close()
    for kind, first in report["first_failures"].items():
        print(describe_failure(kind, first, 0), file=sys.stderr)
    problem = reward_broken(report, "on the held-out prompts")
    if problem:
        raise RewardFunctionError(problem)
    return result
