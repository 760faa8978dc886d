"""The rollout worker: one per rollout process, whatever its groups are made of.

It drives a `GroupProducer` (RLVR prompts, environment episodes) as coroutines
on its `InferenceHub`'s event loop: admit what the async ratio allows, play
each group on the hub, put finished groups in its `SampleBuffer`. The trainer
pulls batches with `get_batch` and pushes weights with `update_weights`.

Admission implements the asynchronous ratio alpha (ROLL Flash): a worker
that has received s weight pushes (one per trainer step) may have started at
most (s + alpha + 1) x quota groups in total (plus `extra` kept in flight and
one for every group that will never train: filtered out, or lost), where
quota is its share of the groups per step. Groups are consumed oldest first,
one quota per trainer step, so every group is trained on at most alpha steps
after the one that started it; alpha = 0 is synchronous training. s is the
number of pushes, not the version: while the trainer pushes unchanged weights
(critic warm-up) versions stand still, and those steps cost no staleness.

Weights have one slot, the hub's: `update_weights` hands them over and returns
at once; the hub swaps them in between two engine rounds. A request in flight
keeps its tokens and finishes under the new weights with its original version
tag (interruptible generation, as in AReaL and ROLL); with `interrupt=False`
the hub first lets what is in flight finish, and nothing new starts meanwhile.

The loop runs in the worker's own thread (`background=True`), or, for a
synchronous run in one process, in the caller's thread inside `get_batch`:
generation and training alternate anyway, and torch ops from a second thread
would bring a second OpenMP thread team competing for the same cores. A
producer whose groups wait on environments always gets the thread.

The same class runs in-process (`runtime.kind=inline`) or as a Ray actor.
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import io
import logging
import threading
import time
import traceback
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import torch

from cadence.inference.hub import InferenceHub
from cadence.inference.prefix_reuse import reuse_metrics
from cadence.rollout.buffer import SampleBuffer
from cadence.rollout.evaluate import EvalResult
from cadence.rollout.producer import GroupKeys, GroupProducer
from cadence.rollout.sample import Group
from cadence.yaml_config import ConfigError

T = TypeVar("T")
log = logging.getLogger(__name__)


class NoTimeline:
    """The dashboard's span recorder, switched off."""

    def enter(self, state: str, step: int | None = None) -> None:
        pass

    def close(self) -> None:
        pass


def worker_quotas(groups_per_step: int, workers: int) -> list[int]:
    """Split the groups of one step over workers as evenly as possible."""
    base, extra = divmod(groups_per_step, workers)
    return [base + (i < extra) for i in range(workers)]


_frozen = False


def _freeze_what_lives_for_the_run() -> None:
    """Keep the garbage collector's full passes off what exists by now (modules, model,
    tokenizer: it lives for the whole run). Generation allocates a few futures and tasks per
    answer, which trigger full collections now and then; each walked that whole heap again
    (~0.3 s on the built-in model, a tenth of a step's rollout CPU). Once per process."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.collect()
        gc.freeze()
        atexit.register(gc.unfreeze)  # collected at exit as usual (nanobind reports leaks otherwise)


class RolloutWorker:
    def __init__(
        self,
        producer: GroupProducer,
        hub: InferenceHub,
        *,
        quota: int,
        alpha: int,
        extra: int = 0,
        background: bool = True,
        interrupt: bool = True,
        index: int = 0,
        first_group_id: int = 0,
        group_id_step: int = 1,
        threads: int = 0,
        timeline: Any = None,
    ) -> None:
        self.producer = producer
        self.hub = hub
        # The swap itself is the rollout's weight_sync span; a swap that waited for requests in
        # flight opens admission.
        self.hub.before_swap = lambda: self.timeline.enter("weight_sync")
        self.hub.on_swap = self._swapped
        self.engine = hub.replicas[0].engine
        self.quota = quota
        self.alpha = alpha
        self.extra = extra  # groups kept in flight beyond alpha's allowance
        self.background = background or producer.needs_running_loop
        self.interrupt = interrupt
        self.index = index
        self.threads = threads
        self.timeline = timeline or NoTimeline()
        self.buffer = SampleBuffer(alpha)
        self.version = 0
        self.swaps = 0  # weight pushes received: the admission clock (one per trainer step)
        self.started_groups = 0  # groups admitted since the run began (all versions)
        self.groups_dropped = 0  # groups the producer gave up on (filtered, lost, stale): never trained, replaced
        self.handed_out = 0  # groups given to the trainer
        self.next_group_id = first_group_id
        self.group_id_step = group_id_step  # several workers fill one batch: ids never collide
        self.keys = GroupKeys(producer.first_key)  # which group comes next; which were trained on
        self._keys: dict[int, int] = {}  # group id -> its key, until trained on
        self._tasks: set[asyncio.Task] = set()  # groups being played
        self._own_loop: asyncio.AbstractEventLoop | None = None  # made on first use (the simulator has its own)
        self._running: asyncio.AbstractEventLoop | None = None  # the loop _main runs on, while it runs
        self._changed: asyncio.Event | None = None  # admission may have room: a group ended, weights came
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: str | None = None
        self._stopped_by: Exception | None = None  # a producer's one-line reason to stop the run
        self._born = time.perf_counter()
        _freeze_what_lives_for_the_run()

    # -- the producer loop --------------------------------------------------------
    def run(self, until: Callable[[], bool]) -> Coroutine[Any, Any, None]:
        """Serve the hub and keep admitting groups until `until()` holds (a coroutine)."""
        return _serve_and_admit(self, until)

    def cancel(self) -> Coroutine[Any, Any, None]:
        """Cancel every group in flight (a coroutine, for whoever runs the worker's loop)."""
        return _cancel(self)

    def _room(self) -> int:
        if not self.interrupt and self.hub.weights_pending():
            return 0  # the swap waits for what is in flight; nothing new starts meanwhile
        allowed = (self.swaps + self.alpha + 1) * self.quota + self.extra + self.groups_dropped
        return allowed - self.started_groups

    def _admit(self) -> None:
        for _ in range(self._room()):
            key, group_id = self.keys.take(), self.next_group_id
            self.next_group_id += self.group_id_step
            self._keys[group_id] = key
            task = asyncio.ensure_future(_play(self, key, group_id))
            self._tasks.add(task)
            task.add_done_callback(self._group_ended)
            self.started_groups += 1

    def _group_ended(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            if isinstance(error, ConfigError):  # a cause the user can act on: said in one line
                self._stopped_by = self._stopped_by or error
            self._error = self._error or "".join(traceback.format_exception(error))
        if self._changed is not None:
            self._changed.set()

    def _swapped(self) -> None:
        self.timeline.enter("generating" if self._tasks else "waiting")
        self._poke()

    def _weights_arrived(self, version: int) -> None:
        self.version = version
        self.swaps += 1
        # Extra groups still open this late could only be dropped as stale: cancel them.
        self.producer.on_weights(version, version - self.alpha if self.extra else None)
        if self._changed is not None:
            self._changed.set()

    @property
    def _loop(self) -> asyncio.AbstractEventLoop:
        """The loop the groups live on, in the worker's thread or the caller's."""
        if self._own_loop is None:
            self._own_loop = asyncio.new_event_loop()
        return self._own_loop

    def _in_loop(self, fn: Callable[..., None], *args: Any) -> None:
        """Run `fn` where the groups live: now if no loop runs them, else on that loop."""
        loop = self._running
        if loop is None or self._in_loop_thread():
            fn(*args)
        else:
            loop.call_soon_threadsafe(fn, *args)

    def _in_loop_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._running
        except RuntimeError:
            return False

    def _check(self) -> None:
        if self._stopped_by is not None:
            raise self._stopped_by
        if self._error:
            raise RuntimeError(f"rollout worker {self.index} failed:\n{self._error}")

    # -- the worker's thread ---------------------------------------------------
    def start(self) -> None:
        if self._thread is None and self.background:
            self._stopping.clear()
            ready = threading.Event()
            self._thread = threading.Thread(target=self._serve, args=(ready,), name=f"rollout-{self.index}",
                                            daemon=True)
            self._thread.start()
            ready.wait()

    def _serve(self, ready: threading.Event) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(_serve_until_stopped(self, ready))
        except Exception:  # surfaced to the trainer on its next call, not lost in a thread
            self._error = self._error or traceback.format_exc()
        finally:
            ready.set()

    def _on_loop(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` where the groups live: on the worker's thread, or here while the hub serves."""
        if self._thread is not None:
            if not self._thread.is_alive():
                coro.close()
                self._check()
                raise RuntimeError(f"rollout worker {self.index}: its loop thread has stopped")
            return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)
        return self._run_here(asyncio.wait_for(self.hub.serving(coro), timeout))

    def _run_here(self, awaitable: Coroutine[Any, Any, T]) -> T:
        """Run the loop in this thread until `awaitable` is done. A Ctrl-C lands in whatever task
        was running: it is reported once, by the caller, not again when that task is collected."""
        try:
            return self._loop.run_until_complete(awaitable)
        except BaseException:
            for task in asyncio.all_tasks(self._loop):
                if task.done() and not task.cancelled():
                    task.exception()
            raise

    # -- what the trainer calls ------------------------------------------------------
    def get_batch(self, trainer_version: int, timeout: float = 600.0) -> list[Group]:
        """This worker's quota of fresh groups for `trainer_version` (blocks)."""
        if self.background:
            self.start()
            deadline = time.perf_counter() + timeout
            while not self.buffer.wait_ready(self.quota, trainer_version, timeout=0.05):
                self._check()  # a failed loop thread surfaces here, not as a timeout
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"sample buffer: {len(self.buffer)}/{self.quota} fresh groups")
        else:
            def ready() -> bool:
                return self.buffer.wait_ready(self.quota, trainer_version, timeout=0)

            try:
                self._run_here(asyncio.wait_for(self.run(ready), timeout))
            except TimeoutError:
                raise TimeoutError(f"sample buffer: {len(self.buffer)}/{self.quota} fresh groups") from None
            self.timeline.enter("waiting")  # generation pauses while the caller trains
        return self.take_batch(trainer_version)

    def take_batch(self, trainer_version: int) -> list[Group]:
        """The quota of fresh groups, which must be in the buffer already (get_batch waits)."""
        batch = self.buffer.get_batch(self.quota, trainer_version, timeout=0)
        self.handed_out += len(batch)
        for group in batch:
            self.keys.trained(self._keys.pop(group.group_id))
        self._in_loop(self._poke)  # a group taken frees room; the loop re-checks admission
        return batch

    def _poke(self) -> None:
        if self._changed is not None:
            self._changed.set()

    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Hand new weights to the hub and return at once: the hub swaps them in between two
        engine rounds, so the trainer never queues behind the engine. The tensors must not
        change afterwards (WorkerGroup sends copies to a generating worker)."""
        self.hub.update_weights(state_dict, version)
        self._in_loop(self._weights_arrived, version)

    def evaluate(self, samples: int = 1) -> EvalResult:
        """Held-out success of the newest weights (queued ones go in first)."""

        self.hub.swap_next_round()
        self.timeline.enter("evaluating")
        return self._on_loop(_evaluate(self, samples))

    def metrics(self) -> dict[str, float]:
        engine = self.engine.stats()
        wall = time.perf_counter() - self._born
        return {
            **self.buffer.stats(),
            "rollout/engine_busy_fraction": engine.get("busy_s", 0.0) / max(wall, 1e-9),
            "rollout/engine_busy_s": engine.get("busy_s", 0.0),
            "rollout/engine_steps": float(engine.get("decode_steps", engine.get("engine_steps", 0))),
            "rollout/in_flight_groups": float(len(self._tasks)),
            **self.producer.metrics(),
            **reuse_metrics(engine),
        }

    def health(self) -> dict:
        """The producer's health report: its reward function's or its plays' counters and first
        failures (see GroupProducer.health)."""
        return self.producer.health()

    def state_dict(self) -> dict:
        """Where to resume: the group keys trained on (see GroupKeys) and the admission clock."""
        state = {"keys": self.keys.state_dict(), "next_group_id": self.next_group_id, "swaps": self.swaps}
        # The engine's sampling RNG: with it a synchronous run resumes bit-identically (nothing is
        # in flight between steps). Asynchronous runs regenerate in-flight groups, so theirs differ.
        state["engine"] = self.engine.sampling_state()
        return state

    def load_state_dict(self, state: dict, version: int) -> None:
        """Resume at trainer `version` with nothing in flight."""
        self.keys.load_state_dict(state)
        if "engine" in state:  # absent from checkpoints written before it was saved
            self.engine.load_sampling_state(state["engine"])
        self.next_group_id = state.get("next_group_id", self.next_group_id)
        self.version = version
        self.swaps = state.get("swaps", version)  # older checkpoints: one push per version
        self.started_groups = self.swaps * self.quota
        self.producer.on_weights(version, None)

    def stop(self) -> None:
        """Stop generating (groups in flight are cancelled); evaluation still works."""
        self._stopping.set()
        self._in_loop(self._poke)
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None

    def close(self) -> None:
        self.stop()
        loop = self._own_loop
        if loop is not None and not loop.is_closed() and not loop.is_running():
            before = asyncio.all_tasks(loop)  # e.g. an interrupted run's own tasks
            loop.run_until_complete(_cancel_within(self, CANCEL_WAIT_S))
            left = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in left:
                task.cancel()
            if left:
                loop.run_until_complete(asyncio.wait(left, timeout=CANCEL_WAIT_S))
            for task in before | set(left):
                if task.done() and not task.cancelled():
                    task.exception()  # retrieved: it ended because we stopped it
            loop.close()
        self.producer.close()
        self.timeline.close()


# The loop's side of the worker: plain functions, not methods, because Ray makes any actor class
# with an `async def` an asyncio actor, whose calls then share one event loop (a blocking
# get_batch would stall it, and evaluate could not run the worker's own loop).
async def _serve_and_admit(worker: RolloutWorker, until: Callable[[], bool]) -> None:
    worker._running = asyncio.get_running_loop()
    worker._changed = asyncio.Event()
    stop = asyncio.Event()
    server = asyncio.ensure_future(worker.hub.serve(stop))
    try:
        await worker.producer.start()
        while True:
            worker._check()
            worker._admit()
            if until():
                break
            worker.timeline.enter("generating" if worker._tasks else "waiting")
            if not worker.background and not worker._tasks and not worker._room():
                raise RuntimeError(f"rollout worker {worker.index}: idle with an incomplete batch")
            worker._changed.clear()
            await worker._changed.wait()
    finally:
        worker._running = None
        stop.set()
        if not server.done():
            await server
        elif not server.cancelled():
            server.exception()  # an interrupt that struck mid-round surfaces once, where it struck


async def _play(worker: RolloutWorker, key: int, group_id: int) -> None:
    group = await worker.producer.play(key, group_id)
    if group is None:
        worker.groups_dropped += 1
        worker._keys.pop(group_id, None)
    else:
        worker.buffer.put(group)


async def _evaluate(worker: RolloutWorker, samples: int) -> EvalResult:
    await worker.producer.start()  # agents: after a stop, the endpoint comes back for evaluation
    return await worker.producer.evaluate(samples)


async def _serve_until_stopped(worker: RolloutWorker, ready: threading.Event) -> None:
    asyncio.get_running_loop().call_soon(ready.set)
    try:
        await _serve_and_admit(worker, worker._stopping.is_set)
    finally:
        await _cancel_within(worker, CANCEL_WAIT_S)


CANCEL_WAIT_S = 10.0  # a guard only: cancelled groups end within a few loop rounds


async def _cancel_within(worker: RolloutWorker, seconds: float) -> None:
    """Cancel what is in flight, waiting at most `seconds` for it to end.

    A cancelled group ends within a few loop rounds. One that does not has dropped its
    cancellation somewhere (and may wait for a hub that stopped serving): that is a bug, so
    where each task still stands is logged as an error, and the stop goes on without them.
    """
    cancelling = asyncio.ensure_future(_cancel(worker))
    done, _ = await asyncio.wait([cancelling], timeout=seconds)
    if cancelling in done:
        cancelling.result()
        return
    here = asyncio.current_task()
    stuck = [t for t in asyncio.all_tasks() if t is not here and t is not cancelling and not t.done()]
    log.error(
        "rollout worker %d: %d task(s) still running %g s after they were cancelled; a coroutine dropped "
        "its cancellation. Stopping without them. Where they stand:\n%s",
        worker.index, len(stuck), seconds, "".join(_where(t) for t in stuck),
    )


def _where(task: asyncio.Task) -> str:
    out = io.StringIO()
    task.print_stack(file=out)
    return out.getvalue()


async def _cancel(worker: RolloutWorker) -> None:
    tasks = list(worker._tasks)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await worker.producer.stop()
