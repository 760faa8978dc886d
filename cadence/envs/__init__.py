"""Text environments for agentic RL: the contract, the runner, built-ins and adapters.

The episode loop needs only `EnvConfig` and `EnvRunner` (see `cadence.envs.runner`).
"""

from cadence.envs.config import EnvConfig, LatencyConfig
from cadence.envs.contract import AsyncTextEnv, EnvDied, TextEnv
from cadence.envs.runner import EnvFailure, EnvRunner, ResetResult, StepResult

__all__ = [
    "AsyncTextEnv",
    "EnvConfig",
    "EnvDied",
    "EnvFailure",
    "EnvRunner",
    "LatencyConfig",
    "ResetResult",
    "StepResult",
    "TextEnv",
]
