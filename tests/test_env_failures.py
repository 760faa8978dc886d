"""An environment that fails on every episode stops the run with its cause (issue 29 item 5)."""

from __future__ import annotations

import pytest

from cadence.config import load_config
from cadence.recipes.train_rlvr import train
from cadence.rollout.failures import ProducerFailing
from tests.quick_run import QUICK_RUN

BROKEN = [
    *QUICK_RUN, "env.action_tag=null", "env.max_turns=2", "rollout.max_new_tokens=3", "eval.before=false",
    "eval.after=false", "trainer.steps=2", "rollout.engine.backend=mock", "rollout.engine.mock.vocab_size=256",
]


@pytest.mark.parametrize(
    "env, cause",
    [
        ("StepAlwaysRaises", r"raised during step: step: ValueError: the board is broken"),
        ("ResetAlwaysRaises", r"raised during reset: reset: KeyError: 'no such level'"),
        ("HugeFirstObservation", r"the first observation is \d+ tokens.*rollout\.max_context_tokens"),
    ],
)
@pytest.mark.parametrize("alpha", [0, 1])
def test_an_environment_that_always_fails_stops_the_run_with_its_cause(env, cause, alpha, tmp_path):
    cfg = load_config(None, [*BROKEN, f"env.name=python:tests/broken_envs.py:{env}", f"rollout.async_ratio={alpha}",
                             f"logging.run_dir={tmp_path}"])
    with pytest.raises(ProducerFailing, match=cause) as failing:
        train(cfg)
    assert "\n" not in str(failing.value)  # one line
    assert f"env.name=python:tests/broken_envs.py:{env}" in str(failing.value)
    if env != "HugeFirstObservation":  # the first failure of each kind, traceback from the env's code on
        log = (tmp_path / "env_errors.log").read_text()
        assert "broken_envs.py" in log and "cadence/envs/runner.py" not in log
