"""The inference hub: one asyncio front over engine replicas, shared by every caller.

RLVR answers and agent episodes both ask for completions one request at a
time (`await hub.generate(request)`), from as many coroutines as there are
answers or episodes in flight. The hub keeps each replica's continuous batch
fed with all of them: a request joins the running batch at the replica's next
step, and its caller resumes the moment its last token is out.

    callers (coroutines) --generate--> hub --add_request--> replica 0 .. K-1
                         <--result---      <--step()------

- Routing: a new request goes to the least-loaded replica (running plus
  waiting requests). A caller that passes `affinity` (an episode id) keeps all
  its turns on the replica its first turn went to, where its context is most
  likely still cached (vLLM's prefix cache; verl routes the same way). The
  affinity becomes the request's `cache_key`, under which the embedded engine
  keeps each turn's KV cache for the next; `forget(affinity)` drops it.
- Driving: `pump()` is one round: queued weights are swapped in, queued
  requests and aborts reach their replicas, then each replica with work does
  one `step()`. Engines are driven from one thread at a time, so requests and
  aborts that arrive during a step wait in the hub until the round ends.
  `serve()` pumps until stopped and sleeps while no replica has work;
  between two rounds it lets the callers a round resumed run to their
  next await (score, join the group, reach the buffer) before the next step.
  Replicas step one after the other in the loop's thread by default: on CPU
  that keeps torch in one thread team, and the torch op releases nothing the
  event loop could use anyway. `parallel=True` steps them in worker threads
  at once, for engines that wait rather than compute (vLLM on a GPU, the mock
  engine's simulated latency).
- Weights: the one slot new weights wait in. `update_weights` may be called
  from any thread; the swap happens between two rounds on every replica.
  Requests in flight keep their tokens and start version (interruptible
  generation) and every result records the version that started it and the
  one that finished it. With `interrupt=False` the swap waits until nothing
  is in flight (`swap_next_round()` makes the next round swap regardless).
- Abort: `abort(request_id)` ends a request at the next round; its caller
  gets the partial result with finish_reason "abort".
- Failures: an engine that refuses a request (`add_request` raises) fails
  that request; one whose `step` raises fails every request on that replica
  (the step does not say which one broke it), which it is told to abort. Their
  callers get `EngineFailed`; the error is logged, and the hub keeps serving.
  An exception that escaped instead would end `serve()` and leave every
  caller waiting for ever.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from torch import Tensor

from cadence.inference.types import GenRequest, GenResult, InferenceEngine

T = TypeVar("T")
log = logging.getLogger(__name__)
SETTLE_ROUNDS = 8  # loop rounds between two engine steps (InferenceHub._let_callers_run)


class EngineFailed(RuntimeError):
    """The engine raised while it held this request (see the module docstring, Failures)."""


@dataclass
class _Replica:
    engine: InferenceEngine
    to_add: list[GenRequest] = field(default_factory=list)
    to_abort: list[str] = field(default_factory=list)
    to_forget: list[str] = field(default_factory=list)  # cache keys whose episode ended
    owned: set[str] = field(default_factory=set)  # request ids submitted here, not yet resolved

    def load(self) -> int:
        return len(self.owned)


class InferenceHub:
    """Async `generate` over engine replicas (see module docstring)."""

    def __init__(self, engines: Sequence[InferenceEngine], parallel: bool = False, interrupt: bool = True) -> None:
        if not engines:
            raise ValueError("an InferenceHub needs at least one engine replica")
        self.replicas = [_Replica(e) for e in engines]
        self.parallel = parallel
        self.interrupt = interrupt
        self._force_swap = False
        self.before_swap: Callable[[], None] | None = None  # told as weights start going in (the loop's thread)
        self.on_swap: Callable[[], None] | None = None  # told after weights went in (in the loop's thread)
        self._futures: dict[str, asyncio.Future[GenResult]] = {}
        self._where: dict[str, _Replica] = {}
        self._affinity: dict[str, int] = {}
        self._weights_lock = threading.Lock()
        self._new_weights: tuple[dict[str, Tensor], int] | None = None
        self._work: asyncio.Event | None = None  # set when something arrives for an idle serve()
        self._work_loop: asyncio.AbstractEventLoop | None = None

    # -- what callers use ---------------------------------------------------
    @property
    def version(self) -> int:
        """The policy version the replicas generate with (the oldest, mid-swap)."""
        return min(r.engine.version for r in self.replicas)

    def submit(self, req: GenRequest, affinity: str | None = None) -> asyncio.Future[GenResult]:
        """Queue `req` on a replica; the future resolves with its result. Call in the loop."""
        if req.request_id in self._futures:
            raise ValueError(f"request id {req.request_id!r} is already in flight")
        replica = self._route(affinity)
        if affinity is not None and req.cache_key is None:
            req = dataclasses.replace(req, cache_key=affinity)
        future: asyncio.Future[GenResult] = asyncio.get_running_loop().create_future()
        self._futures[req.request_id] = future
        self._where[req.request_id] = replica
        replica.owned.add(req.request_id)
        replica.to_add.append(req)
        self._wake()
        return future

    async def generate(self, req: GenRequest, affinity: str | None = None) -> GenResult:
        """Complete `req`; resumes when its last token is out (or it was aborted)."""
        return await self.submit(req, affinity)

    def abort(self, request_id: str) -> None:
        """End a request at the next round; its caller gets the partial result."""
        replica = self._where.get(request_id)
        if replica is None:
            return
        if any(r.request_id == request_id for r in replica.to_add):
            # Never reached the engine: answer at once with nothing generated.
            req = next(r for r in replica.to_add if r.request_id == request_id)
            replica.to_add.remove(req)
            version = self.version if req.version is None else req.version
            self._resolve(GenResult(request_id, list(req.prompt_ids), [], [], "abort", "", version, self.version))
            return
        replica.to_abort.append(request_id)
        self._wake()

    def forget(self, affinity: str) -> None:
        """An episode ended: its turns need not stay on one replica, nor its KV cache be kept."""
        index = self._affinity.pop(affinity, None)
        if index is not None:
            self.replicas[index].to_forget.append(affinity)

    def update_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        """Queue new weights for every replica (any thread); swapped in between two rounds."""
        with self._weights_lock:
            self._new_weights = (state_dict, version)
        work, loop = self._work, self._work_loop
        if work is not None and loop is not None:
            loop.call_soon_threadsafe(work.set)

    def weights_pending(self) -> bool:
        """New weights are waiting to be swapped in."""
        return self._new_weights is not None

    def swap_next_round(self) -> None:
        """The next round swaps queued weights in even with requests in flight."""
        self._force_swap = True

    def run(self, reqs: list[GenRequest]) -> list[GenResult]:
        """Complete `reqs` from synchronous code (no event loop running in this thread).

        Other requests in flight keep being served meanwhile, and their callers get their
        results as usual. Results come back in request order.
        """

        async def until_done() -> list[GenResult]:
            futures = [self.submit(r) for r in reqs]
            while not all(f.done() for f in futures):
                await self.pump()
            return [f.result() for f in futures]

        return asyncio.run(until_done())

    # -- driving ------------------------------------------------------------
    def apply_weights(self) -> None:
        """Swap queued weights in now. Only between rounds: never while a pump is running."""
        if not (self.interrupt or self._force_swap) and self._futures:
            return  # what is in flight finishes on the weights that started it
        self._force_swap = False
        with self._weights_lock:
            new, self._new_weights = self._new_weights, None
        if new is not None:
            state_dict, version = new
            if self.before_swap is not None:
                self.before_swap()
            for replica in self.replicas:
                replica.engine.update_weights(state_dict, version)
            if self.on_swap is not None:
                self.on_swap()

    async def pump(self) -> bool:
        """One round (swap weights, hand over requests and aborts, one step each). False: idle."""
        self.apply_weights()
        busy = []
        for replica in self.replicas:
            self._hand_over(replica)
            if replica.engine.has_unfinished():
                busy.append(replica)
        if not busy:
            return False
        if self.parallel and len(busy) > 1:
            rounds = await asyncio.gather(*(asyncio.to_thread(r.engine.step) for r in busy), return_exceptions=True)
        else:
            rounds = [self._step(r) for r in busy]
        for replica, results in zip(busy, rounds, strict=True):
            if isinstance(results, BaseException):
                self._fail_replica(replica, results)
                continue
            for result in results:
                self._resolve(result)
        return True

    @staticmethod
    def _step(replica: _Replica) -> list[GenResult] | Exception:
        try:
            return replica.engine.step()
        except Exception as e:  # contained: _fail_replica
            return e

    async def serve(self, stop: asyncio.Event) -> None:
        """Pump until `stop` is set; sleep (no polling) while there is nothing to do."""
        self._work = asyncio.Event()
        self._work_loop = asyncio.get_running_loop()
        try:
            while not stop.is_set():
                if await self.pump():
                    await self._let_callers_run()
                    continue
                self._work.clear()
                if self._queued():
                    continue
                stopping = asyncio.ensure_future(stop.wait())
                working = asyncio.ensure_future(self._work.wait())
                await asyncio.wait({stopping, working}, return_when=asyncio.FIRST_COMPLETED)
                stopping.cancel()
                working.cancel()
        finally:
            self._work = self._work_loop = None

    @staticmethod
    async def _let_callers_run() -> None:
        """Yield the loop SETTLE_ROUNDS times before the next step, so that what a round's results
        set off runs now, not one engine step per hop: a finished answer's caller scores it (a
        batch sent to the reward workers), the outcome comes back (it arrived during the step),
        the answer joins its group, the group's gather ends, the group reaches the buffer. With
        one yield a group reached the buffer 5-6 engine steps after its last answer (docs/results.md,
        issue 36); an idle round costs microseconds against a step's milliseconds."""
        for _ in range(SETTLE_ROUNDS):
            await asyncio.sleep(0)

    async def serving(self, coro: Awaitable[T]) -> T:
        """Await `coro` while this hub serves (for callers with no serve() of their own)."""
        stop = asyncio.Event()
        server = asyncio.create_task(self.serve(stop))
        try:
            return await coro
        finally:
            stop.set()
            await server

    # -- internals ------------------------------------------------------------
    def _queued(self) -> bool:
        """Anything for the next round that did not reach an engine yet."""
        return self._new_weights is not None or any(r.to_add or r.to_abort for r in self.replicas)

    def _route(self, affinity: str | None) -> _Replica:
        if affinity is not None and affinity in self._affinity:
            return self.replicas[self._affinity[affinity]]
        index = min(range(len(self.replicas)), key=lambda i: self.replicas[i].load())
        if affinity is not None:
            self._affinity[affinity] = index
        return self.replicas[index]

    def _hand_over(self, replica: _Replica) -> None:
        for req in replica.to_add:
            try:
                replica.engine.add_request(req)
            except Exception as e:
                log.warning("the engine refused request %s: %s: %s", req.request_id, type(e).__name__, e)
                self._fail(req.request_id, EngineFailed(f"the engine refused the request: {type(e).__name__}: {e}"))
        replica.to_add.clear()
        for request_id in replica.to_abort:
            result = replica.engine.abort(request_id)
            if result is not None:
                self._resolve(result)
        replica.to_abort.clear()
        forget = getattr(replica.engine, "forget", None)  # engines that keep per-episode caches
        for key in replica.to_forget:
            if forget is not None:
                forget(key)
        replica.to_forget.clear()

    def _resolve(self, result: GenResult) -> None:
        future = self._settle(result.request_id)
        if future is not None and not future.done():
            future.set_result(result)

    def _fail(self, request_id: str, error: EngineFailed) -> None:
        future = self._settle(request_id)
        if future is not None and not future.done():
            future.set_exception(error)

    def _settle(self, request_id: str) -> asyncio.Future[GenResult] | None:
        """The request's future, no longer in flight anywhere."""
        replica = self._where.pop(request_id, None)
        if replica is not None:
            replica.owned.discard(request_id)
        return self._futures.pop(request_id, None)

    def _fail_replica(self, replica: _Replica, error: BaseException) -> None:
        """A step raised: every request on the replica fails, and the engine drops them."""
        index = self.replicas.index(replica)
        log.error("engine replica %d failed a step; its %d requests fail", index, len(replica.owned),
                  exc_info=error)
        failure = EngineFailed(f"engine replica {index} failed: {type(error).__name__}: {error}")
        for request_id in sorted(replica.owned):
            try:
                replica.engine.abort(request_id)
            except Exception:
                log.exception("engine replica %d could not drop request %s", index, request_id)
            self._fail(request_id, failure)

    def _wake(self) -> None:
        if self._work is not None:
            self._work.set()
