"""`RewardConfig`: which reward scores a response, and how it is sandboxed.

Reward names:

* ``"auto"``: the task's default (arith and jsonl: exact_match; rg:*: reasoning_gym).
* ``"exact_match"``: extracted answer == gold, after stripping whitespace.
* ``"math_verify"``: math-verify equivalence (``1/2`` == ``0.5`` == ``\\frac{1}{2}``); on a data
  file (task.name=file) it compares the last ``\\boxed{...}`` unless `extract` says otherwise.
* ``"reasoning_gym"``: the reasoning-gym dataset's own scorer (partial credit possible).
* ``"unit_tests"``: the response's code against the task's tests (a list per row), run in a
  sandbox; settings under ``reward.unit_tests`` (cadence/rewards/unit_tests.py).
* ``"python:pkg.module:fn"`` or ``"python:/path/to/file.py:fn"``: a user function
  ``fn(prompt: Prompt, response: str) -> float``; checked (imported) at load time.

Every reward runs inside `RewardGuard` worker processes: one that raises, hangs
past `timeout_s` or returns a non-finite value scores 0.0 and is counted.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cadence.python_spec import PYTHON_PREFIX
from cadence.rewards.python_reward import resolve_python_reward
from cadence.rewards.unit_tests import UnitTestsConfig

BUILTIN_REWARDS = ("exact_match", "math_verify", "reasoning_gym", "unit_tests")


class RewardConfig(BaseModel):
    """How responses are scored."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        "auto",
        description="'auto' (the task's default), 'exact_match', 'math_verify', "
        "'reasoning_gym', or 'python:module:function' / 'python:/file.py:function'.",
    )
    timeout_s: float = Field(
        5.0, gt=0, description="Seconds one response may take to score before it gets 0.0."
    )
    workers: int = Field(
        1, ge=1, description="Reward worker processes (parallel scoring, isolated from training)."
    )
    extract: Literal["auto", "none", "first_line", "answer_tag", "last_number", "boxed", "gsm8k"] = Field(
        "auto",
        description="How built-in rewards take the answer from a response: 'none' (all of "
        "it), 'first_line' (first non-empty line), 'answer_tag' (last <answer>...</answer>, "
        "else all of it), 'last_number' (of the first line), 'boxed' (last \\boxed{...}), "
        "'gsm8k' (the number after the last ####), or 'auto' (the task's convention; "
        "math_verify on a data file: boxed). python: rewards get the raw text.",
    )
    unit_tests: UnitTestsConfig = Field(
        default_factory=UnitTestsConfig, description="Settings of reward.name 'unit_tests'."
    )

    @model_validator(mode="after")
    def _check_unit_tests(self) -> RewardConfig:
        if self.name == "unit_tests" and self.timeout_s <= self.unit_tests.test_timeout_s:
            raise ValueError(
                f"reward.timeout_s ({self.timeout_s:g}) must exceed reward.unit_tests.test_timeout_s "
                f"({self.unit_tests.test_timeout_s:g}): the guard would stop the scoring before a test "
                "ends; raise reward.timeout_s to cover every test of a prompt"
            )
        return self

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        if name == "auto" or name in BUILTIN_REWARDS:
            return name
        if name.startswith(PYTHON_PREFIX):
            resolve_python_reward(name)  # raises ValueError with the reason
            return name
        raise ValueError(
            f"reward.name {name!r} is unknown: use 'auto', {', '.join(map(repr, BUILTIN_REWARDS))}, "
            "or 'python:module:function' / 'python:/path/file.py:function'"
        )
