"""Simulated environment latency: slow, fail-slow and fail-stop steps around any environment.

ROLL Flash measures environment-level async rollout and redundancy under a
per-step delay drawn from a normal distribution (mean 10 s, std 10 s in the
paper's test). Each step of the wrapped environment first waits

    delay ~ max(0, N(mean_s, std_s))
    x fail_slow_factor      with probability fail_slow_share (a fail-slow step)
    forever                 with probability fail_stop_share (a fail-stop step)

A fail-stop step never answers: the runner's step timeout ends the episode and
replaces the environment (`close()` releases the waiting step). Draws come from
a generator seeded by (seed, episode seed, which wrapper instance): an
episode's delays do not depend on how episodes interleave, and the episodes
of a group (same episode seed, each on its own environment instance) draw
independently, as separate environment servers would. `reset` is not delayed.

`with_latency` returns a wrapper of the inner environment's kind: a sync one
sleeps in the runner's worker thread, an async one on the event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import os
import random
import threading
from typing import Any

from cadence.data.tasks import stable_hash
from cadence.envs.contract import ResetReturn, StepReturn

_INSTANCES = itertools.count()  # wrapper instances made in this process


class _LatencyDraws:
    def __init__(
        self,
        env: Any,
        mean_s: float = 0.0,
        std_s: float = 0.0,
        fail_slow_share: float = 0.0,
        fail_slow_factor: float = 10.0,
        fail_stop_share: float = 0.0,
        seed: int = 0,
        instance: tuple[int, ...] | None = None,
    ) -> None:
        self.env = env
        self.mean_s, self.std_s = mean_s, std_s
        self.fail_slow_share, self.fail_slow_factor = fail_slow_share, fail_slow_factor
        self.fail_stop_share = fail_stop_share
        self.seed = seed
        self.action_tag = getattr(env, "action_tag", "answer")
        self._rng = random.Random(seed)
        # Which wrapper this is, in the draws' seed; a simulator names its instances itself so
        # that a run's draws do not depend on what else this process made before.
        self._instance = instance if instance is not None else (os.getpid(), next(_INSTANCES))

    def _start_episode(self, episode_seed: int) -> None:
        self._rng = random.Random(stable_hash("latency", self.seed, episode_seed, *self._instance))

    def next_delay(self) -> float | None:
        """Seconds the next step waits; None for a fail-stop step (it never answers)."""
        u = self._rng.random()
        delay = max(0.0, self._rng.gauss(self.mean_s, self.std_s))
        if u < self.fail_stop_share:
            return None
        if u < self.fail_stop_share + self.fail_slow_share:
            return delay * self.fail_slow_factor
        return delay

    def __getattr__(self, name: str) -> Any:
        # Everything else (expert_action, render, ...) is the inner environment's.
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)


class LatencyEnv(_LatencyDraws):
    """Latency around a sync environment: the wait happens in the caller's thread."""

    def __init__(self, env: Any, **settings: Any) -> None:
        super().__init__(env, **settings)
        self._closed = threading.Event()

    def reset(self, seed: int) -> ResetReturn:
        self._start_episode(seed)
        return self.env.reset(seed)

    def step(self, action: str) -> StepReturn:
        delay = self.next_delay()
        self._closed.wait(delay)  # None: until close()
        if self._closed.is_set():
            raise RuntimeError("environment closed while its step was waiting")
        return self.env.step(action)

    def close(self) -> None:
        self._closed.set()
        close = getattr(self.env, "close", None)
        if close is not None:
            close()


class AsyncLatencyEnv(_LatencyDraws):
    """Latency around an async environment: the wait is an `asyncio.sleep` (or forever)."""

    async def reset(self, seed: int) -> ResetReturn:
        self._start_episode(seed)
        return await self.env.reset(seed)

    async def step(self, action: str) -> StepReturn:
        delay = self.next_delay()
        if delay is None:
            await asyncio.Event().wait()  # fail-stop: until the runner's timeout cancels it
        await asyncio.sleep(delay)
        return await self.env.step(action)

    async def close(self) -> None:
        close = getattr(self.env, "close", None)
        if close is not None:
            result = close()
            if inspect.isawaitable(result):
                await result


def with_latency(env: Any, **settings: Any) -> LatencyEnv | AsyncLatencyEnv:
    """`env` behind simulated latency (settings as in `LatencyConfig`), of the same kind as it."""
    if inspect.iscoroutinefunction(env.step):
        return AsyncLatencyEnv(env, **settings)
    return LatencyEnv(env, **settings)
