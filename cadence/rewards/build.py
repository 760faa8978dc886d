"""Build the reward function a RewardConfig names."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence.data.config import task_kind
from cadence.python_spec import PYTHON_PREFIX
from cadence.rewards.config import RewardConfig
from cadence.rewards.python_reward import PythonReward
from cadence.rewards.verifiers import ExactMatch, MathVerify, ReasoningGymReward, RewardFn

if TYPE_CHECKING:
    from cadence.data.tasks import Task


def build_reward(cfg: RewardConfig, task: Task | None = None) -> RewardFn:
    """The reward function `cfg` names; "auto" name/extract come from `task`."""
    name, extract = cfg.name, cfg.extract
    if name.startswith(PYTHON_PREFIX):
        return PythonReward(name)  # user functions see the raw response
    if name == "unit_tests":  # takes the code block, not an extracted answer
        from cadence.rewards.unit_tests import UnitTestReward

        return UnitTestReward(cfg.unit_tests)
    if task is None and (name == "auto" or extract == "auto"):
        raise ValueError("reward.name / reward.extract 'auto' need a task to take defaults from")
    if name == "auto":
        name = task.default_reward  # type: ignore[union-attr]
    if extract == "auto":
        extract = task.default_extract  # type: ignore[union-attr]
        if name == "math_verify" and task_kind(task.name) == "file":  # type: ignore[union-attr]
            extract = "boxed"  # the convention of math data (verl's MATH, TRL's accuracy reward)
    if name == "exact_match":
        return ExactMatch(extract)
    if name == "math_verify":
        return MathVerify(extract)
    if name == "reasoning_gym":
        from cadence.data.reasoning_gym import ReasoningGymTask

        kwargs = {task.dataset: task.kwargs} if isinstance(task, ReasoningGymTask) else {}
        return ReasoningGymReward(extract, kwargs)
    raise ValueError(f"reward.name {name!r} is unknown")
