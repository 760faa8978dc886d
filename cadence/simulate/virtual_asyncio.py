"""asyncio on virtual time: cadence's async rollout code, run as a discrete-event simulation.

The agentic rollout (`EpisodeProducer`, `LockstepEpisodeProducer`, `run_episode`, the
`EnvRunner`'s step timeouts, `AsyncLatencyEnv`'s delays, `RolloutWorker`'s
admission loop) is asyncio code. Rather than re-write it as events, the
simulator runs it unchanged on an event loop whose clock is virtual:

- `VirtualTimeLoop.time()` is a number the loop advances itself. When no
  callback is ready, the loop would block in `select(timeout)` until its
  next timer; here `select` returns at once and the clock jumps by `timeout`
  instead. `asyncio.sleep(10)` and `asyncio.wait_for(..., 30)` therefore
  take 10 and 30 virtual seconds and no real time; everything else (task
  switches, futures, events) behaves as on a real loop.
- `VirtualTimeHub` is cadence's `InferenceHub` whose round lasts what its
  slowest replica's step cost on the mock engine's virtual clock (replicas
  step in parallel on separate GPUs): a round's results reach their callers
  when the round ends, not when Python computed them.

Nothing may wait on a thread: a thread's result would arrive while virtual
time races ahead. The simulated environments are async (they run on the
loop), so the only threads are the ones `EnvRunner` starts and never waits on.
A loop with nothing scheduled and nothing ready has deadlocked in virtual
time; it raises instead of blocking for ever.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Sequence

from cadence.inference.hub import InferenceHub
from cadence.inference.mock import MockEngine
from cadence.inference.types import GenResult


class VirtualTimeStalled(RuntimeError):
    """Every task waits and no timer is set: nothing can ever happen again."""


class _JumpingSelector(selectors.DefaultSelector):
    """Polls the loop's file descriptors without waiting; a wait becomes a jump of the clock."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise VirtualTimeStalled("the simulation stalled: every task waits and no timer is set")
        assert self.loop is not None
        self.loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose `time()` only moves when every task waits (see module docstring)."""

    def __init__(self) -> None:
        self._virtual_now = 0.0
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.loop = self

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        self._virtual_now += seconds


class VirtualTimeHub(InferenceHub):
    """`InferenceHub` whose rounds take the virtual time their engine steps cost."""

    def __init__(self, engines: Sequence[MockEngine]) -> None:
        super().__init__(engines)
        self.engines = list(engines)
        self._round_results: list[GenResult] | None = None
        self._held_until = 0.0

    def hold_until(self, when: float) -> None:
        """No round starts before virtual time `when` (colocated training holds the GPUs)."""
        self._held_until = max(self._held_until, when)

    async def pump(self) -> bool:
        wait = self._held_until - asyncio.get_running_loop().time()
        if wait > 0:
            await asyncio.sleep(wait)
        before = [e.clock() for e in self.engines]
        self._round_results = []  # hold this round's results until the round has taken its time
        try:
            busy = await super().pump()
        finally:
            held, self._round_results = self._round_results, None
        seconds = max(e.clock() - b for e, b in zip(self.engines, before, strict=True))
        if seconds > 0:
            await asyncio.sleep(seconds)
        for result in held:
            super()._resolve(result)
        return busy

    def _resolve(self, result: GenResult) -> None:
        if self._round_results is not None:
            self._round_results.append(result)
        else:  # an abort of a request that never reached an engine: answered at once
            super()._resolve(result)
