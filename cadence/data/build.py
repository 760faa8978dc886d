"""Build the task a TaskConfig names."""

from __future__ import annotations

from cadence.data.config import TaskConfig, task_kind
from cadence.data.tasks import Task


def build_task(cfg: TaskConfig) -> Task:
    """Construct the task a (validated) `TaskConfig` names."""
    kind = task_kind(cfg.name)
    if kind == "arith":
        from cadence.data.arithmetic import ArithmeticTask

        return ArithmeticTask.from_config(cfg)
    if kind == "chain":
        from cadence.data.chain import AdditionChainTask

        return AdditionChainTask.from_config(cfg)
    if kind == "file":
        from cadence.data.file_task import FileTask

        return FileTask.from_config(cfg)
    if kind == "repo_bugs":
        from cadence.data.repo_bugs import RepoBugsTask

        return RepoBugsTask.from_config(cfg)
    from cadence.data.reasoning_gym import ReasoningGymTask

    return ReasoningGymTask.from_config(cfg)
