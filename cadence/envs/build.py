"""Build the environment an EnvConfig names: its class, process isolation and latency wrapper."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cadence.envs.registry import resolve_env_class

if TYPE_CHECKING:
    from cadence.envs.config import EnvConfig


def env_factory(cfg: EnvConfig) -> Callable[[], Any]:
    """A zero-argument constructor of the configured environment (isolation, latency included).

    `EnvRunner` calls it for the first environment and again for each replacement.
    """
    cls = resolve_env_class(cfg.name)
    kwargs = dict(cfg.kwargs)
    latency = cfg.latency

    def make() -> Any:
        if cfg.isolation == "process":
            from cadence.envs.process import ProcessEnv

            env: Any = ProcessEnv(cfg.name, kwargs)
        else:
            env = cls(**kwargs)
        if latency.enabled:
            from cadence.envs.latency import with_latency

            env = with_latency(env, **latency.model_dump())
        return env

    return make
