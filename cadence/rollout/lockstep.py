"""Lock-step synchronous rollout: the baseline without environment-level async.

What agent frameworks without environment-level async do: a batch of
episodes advances turn by turn, all together,

    reset every environment                      (in parallel)  -> barrier
    repeat:
        generate every live episode's turn       (one batch)    -> barrier
        step every live environment              (in parallel)  -> barrier
    until every episode of the batch is done

so every turn waits for the slowest generation and then for the slowest
environment. A batch is one training step's groups (`batch_groups`); the next
batch starts when the last one is done (with alpha > 0 the trainer may be
training meanwhile, but batches never overlap).

It is `EpisodeProducer` with one change: each episode's environment sits behind a
`TurnBarrier` shared by its batch. Episodes, groups, retries, redundancy,
the hub and `run_episode` are the same code as the asynchronous mode, so
the two modes produce the same episodes and differ only in when a turn may
start. An episode that ends (done, lost, out of context, cancelled) leaves
the barrier, so nobody waits for it any more.

Selected with `rollout.env_mode=lockstep`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from cadence.envs.runner import EnvFailure, EnvRunner, ResetResult, StepResult
from cadence.rollout.episode_producer import EpisodeProducer, _OpenGroup
from cadence.rollout.sample import Group


class TurnBarrier:
    """A barrier whose parties may join and leave: released when every party is waiting."""

    def __init__(self) -> None:
        self.parties = 0
        self._waiting = 0
        self._release = asyncio.Event()
        self.rounds = 0  # how many times it released (turn boundaries)

    def join(self) -> None:
        self.parties += 1

    def leave(self) -> None:
        self.parties -= 1
        self._maybe_release()

    async def wait(self) -> None:
        release = self._release
        self._waiting += 1
        self._maybe_release()
        if not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                if not release.is_set():
                    self._waiting -= 1
                raise

    def _maybe_release(self) -> None:
        if self._waiting and self._waiting >= self.parties:
            self._release.set()  # wakes this round's waiters; the next round gets a fresh event
            self._release = asyncio.Event()
            self._waiting = 0
            self.rounds += 1


class LockstepRunner:
    """An `EnvRunner` whose reset and steps end at the batch's barrier."""

    def __init__(self, runner: EnvRunner, barrier: TurnBarrier) -> None:
        self.runner = runner
        self.barrier = barrier

    async def reset(self, seed: int) -> ResetResult | EnvFailure:
        result = await self.runner.reset(seed)
        await self.barrier.wait()  # the first turn is generated for everyone at once
        return result

    async def step(self, response: str) -> StepResult | EnvFailure:
        await self.barrier.wait()  # the whole batch's turn is generated before any env steps
        result = await self.runner.step(response)
        if not result.done:
            await self.barrier.wait()  # the next turn starts when the slowest environment answered
        return result

    async def close(self) -> None:
        await self.runner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)  # counts, env, ...


class LockstepEpisodeProducer(EpisodeProducer):
    """`EpisodeProducer` in lock-step batches of `batch_groups` groups (see the module docstring)."""

    def __init__(self, *args: Any, batch_groups: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batch_groups = batch_groups
        self.waiting: list[tuple[int, int, asyncio.Future]] = []  # (seed, group id, result) for a batch
        self.batches = 0
        self._barrier: TurnBarrier | None = None
        self._batch: set[int] = set()
        self._batch_done = asyncio.Event()
        self._driver: asyncio.Task | None = None

    async def play(self, key: int, group_id: int) -> Group | None:
        """Queue a group; it starts with the next lock-step batch."""
        result = asyncio.get_running_loop().create_future()
        self.waiting.append((key, group_id, result))
        if self._driver is None or self._driver.done():
            self._driver = asyncio.ensure_future(self._drive())
        return await result

    async def stop(self) -> None:
        if self._driver is not None:
            self._driver.cancel()
            await asyncio.gather(self._driver, return_exceptions=True)
        for _, _, result in self.waiting:
            if not result.done():
                result.set_result(None)
        self.waiting.clear()
        await super().stop()

    async def _drive(self) -> None:
        await asyncio.sleep(0)  # the groups admitted together queue up before the batch forms
        while self.waiting:
            batch, self.waiting = self.waiting[: self.batch_groups], self.waiting[self.batch_groups :]
            self._barrier = TurnBarrier()
            self._batch = {gid for _, gid, _ in batch}
            self._batch_done.clear()
            for seed, gid, result in batch:
                opened = self._open(seed, gid)
                opened.add_done_callback(lambda f, r=result: r.done() or _pass_on(f, r))
            await self._batch_done.wait()

    def _stop_run(self, error: Exception) -> None:
        super()._stop_run(error)
        for _, _, result in self.waiting:
            if not result.done():
                result.set_exception(error)
        self.waiting.clear()

    def _start(self, opened: _OpenGroup) -> None:
        assert self._barrier is not None
        self._barrier.join()  # now, before any episode of the batch can reach the barrier
        super()._start(opened)

    async def _episode(self, opened: _OpenGroup, episode_id: str) -> None:
        barrier = self._barrier
        assert barrier is not None
        make_runner = self.make_runner
        try:
            await self._run(opened, episode_id, lambda: LockstepRunner(make_runner(), barrier))
        finally:
            barrier.leave()

    def _close(self, opened: _OpenGroup, keep: bool, stale: bool = False) -> None:
        super()._close(opened, keep, stale)
        self._batch.discard(opened.group.group_id)
        if not self._batch and not self._batch_done.is_set():
            self.batches += 1
            self._batch_done.set()


def _pass_on(source: asyncio.Future, target: asyncio.Future) -> None:
    if source.exception() is not None:
        target.set_exception(source.exception())
    else:
        target.set_result(source.result())
