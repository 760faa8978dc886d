"""`RewardGuard`: score responses so that no reward function can crash or stall a run.

Reward code is the least trusted code in an RL loop: user functions, sympy
evaluating model text (reasoning-gym's countdown), math-verify on adversarial
LaTeX. The guard runs it in worker processes and turns every failure into a
0.0 reward plus a counter:

* raises, or returns a non-numeric / non-finite value -> 0.0, `errors` by type;
* runs past `timeout_s` -> the worker (and its process group) is SIGKILLed and
  restarted, 0.0, `timeouts`;
* the worker dies (segfault, os._exit, OOM kill) -> 0.0, error "WorkerDied",
  worker restarted.

Design: one dispatcher thread owns all worker pipes. Requests queue up; each
idle worker gets a batch (many pairs, one message) and sends results back in
chunks (at the end of the batch, or every `FLUSH_S` during a slow one), so a
trivial reward costs a few microseconds, not a pipe round trip. Each worker
publishes the index and start time of the pair it is on in shared memory: the
dispatcher times out exactly that pair, and re-queues the rest of the batch
(including finished-but-unsent pairs) to a fresh worker. Results resolve
`concurrent.futures` futures: synchronous callers use `score`, asynchronous
ones `submit` (wrap with `asyncio.wrap_future`).

Workers are forked by the dispatcher thread, with the function already in
memory; nothing needs pickling under the default 'fork' start method. The
usual fork caveat applies: a reward function that needs a lock another parent
thread held at fork time (e.g. inside torch) can deadlock, which then shows up
as timeouts; use `start_method="forkserver"` with a picklable function then.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from collections import Counter, deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for
from typing import TYPE_CHECKING, Any

from cadence.data.tasks import Prompt

if TYPE_CHECKING:
    from cadence.rewards.verifiers import RewardFn

MAX_BATCH = 64  # pairs per message to one worker
FLUSH_S = 0.005  # a worker in a slow batch sends finished results at least this often
_MAX_MESSAGE = 500  # characters of an error message kept
_MAX_TRACEBACK = 4000  # characters of a first failure's traceback kept
_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep  # frames here are left out of tracebacks


@dataclass(frozen=True)
class RewardOutcome:
    """The reward for one response, and why it is 0.0 when something went wrong."""

    reward: float
    error: str | None = None
    seconds: float = 0.0


# --------------------------------------------------------------------- worker side


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this worker when the forking thread dies: no orphans."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _describe(exc: BaseException) -> str:
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:  # a hostile __str__
        text = f"{type(exc).__name__}: <unprintable>"
    return text[:_MAX_MESSAGE]


def _user_traceback(exc: BaseException) -> str:
    """The traceback from the first frame outside cadence/rewards: the user's code, not ours."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename.startswith(_OWN_DIR):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _call(
    fn: RewardFn, prompt: Prompt, response: str, seen: set[str] | None = None
) -> tuple[float, str | None, str | None, float, str | None]:
    """(reward, error kind, error message, seconds, traceback) for one pair, never raising.

    The traceback comes with the first exception of each kind (tracked in `seen`),
    so a user can see where their function failed without every pair paying for it.
    """
    start = time.perf_counter()
    try:
        value = fn(prompt, response)
    except (Exception, SystemExit) as exc:
        kind = type(exc).__name__
        tb = None
        if seen is None or kind not in seen:
            tb = _user_traceback(exc)[-_MAX_TRACEBACK:]
            if seen is not None:
                seen.add(kind)
        return 0.0, kind, _describe(exc), time.perf_counter() - start, tb
    seconds = time.perf_counter() - start
    try:
        if value is None or isinstance(value, str | bytes):
            raise TypeError
        reward = float(value)
    except Exception:
        return 0.0, "NonNumericReward", f"reward function returned {type(value).__name__}", seconds, None
    if not math.isfinite(reward):
        return 0.0, "NonFiniteReward", f"reward function returned {reward}", seconds, None
    return reward, None, None, seconds, None


def _worker_main(conn: Connection, fn: RewardFn, progress: Any) -> None:
    """Score batches until the parent closes the pipe or sends None.

    `progress` is shared memory [index in batch, monotonic start time] of the
    pair being scored, written before each call so the parent can time it.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    seen: set[str] = set()  # exception kinds whose traceback was sent already
    os.setpgrp()  # so a timeout kill also takes any processes the function started
    _die_with_parent()
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):
            return
        if batch is None:
            return
        results: list[tuple] = []
        flushed = time.monotonic()
        for index, (prompt, response) in enumerate(batch):
            progress[1] = time.monotonic()
            progress[0] = index
            results.append(_call(fn, prompt, response, seen))
            if time.monotonic() - flushed >= FLUSH_S:
                conn.send(results)
                results, flushed = [], time.monotonic()
        if results:
            conn.send(results)


# --------------------------------------------------------------------- parent side


@dataclass
class _Job:
    prompt: Prompt
    response: str
    future: Future


@dataclass
class _Worker:
    process: Any
    conn: Connection
    progress: Any  # shared [index in batch, monotonic start] of the pair being scored
    batch: list[_Job] = field(default_factory=list)  # the batch in flight; [] when idle
    done: int = 0  # results of `batch` received so far

    def current(self) -> int:
        """Index of the pair the worker is on (never one already answered)."""
        return max(self.done, min(int(self.progress[0]), len(self.batch) - 1))


class RewardGuard:
    """Run `fn(prompt, response) -> float` in `workers` killable subprocesses.

    Use as a context manager, or call `close()`; workers also die with the
    process. Thread-safe: any thread may `submit`/`score` concurrently.
    """

    def __init__(
        self,
        fn: RewardFn,
        timeout_s: float = 5.0,
        workers: int = 1,
        *,
        start_method: str = "fork",
        max_batch: int = MAX_BATCH,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.fn = fn
        self.timeout_s = float(timeout_s)
        self.n_workers = workers
        self.max_batch = max(1, max_batch)
        self._ctx = mp.get_context(start_method)
        self._lock = threading.Lock()
        self._pending: deque[_Job] = deque()
        self._workers: list[_Worker] = []
        self._closing = False
        self._failure: BaseException | None = None
        self._calls = 0
        self._submitted = 0
        self._cancelled = 0
        self._timeouts = 0
        self._restarts = 0
        self._seconds_total = 0.0
        self._error_types: Counter[str] = Counter()
        self._last_error: str | None = None
        self._first_failures: dict[str, dict[str, str | None]] = {}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reward-guard", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._failure is not None:
            raise RuntimeError("reward workers failed to start") from self._failure

    # ----------------------------------------------------------------- public API

    def submit(self, prompt: Prompt, response: str) -> Future[RewardOutcome]:
        """Queue one pair; the future's result is its `RewardOutcome` (it never raises
        for reward failures, only if the guard is closed or broken)."""
        return self.submit_many([(prompt, response)])[0]

    def submit_many(self, pairs: list[tuple[Prompt, str]]) -> list[Future[RewardOutcome]]:
        """Queue pairs in one go (one wake-up of the dispatcher)."""
        jobs = [_Job(prompt, response, Future()) for prompt, response in pairs]
        with self._lock:
            if self._closing or self._failure is not None:
                raise RuntimeError("RewardGuard is closed") from self._failure
            self._pending.extend(jobs)
            self._submitted += len(jobs)
        self._wake()
        return [job.future for job in jobs]

    def score(self, pairs: list[tuple[Prompt, str]]) -> list[RewardOutcome]:
        """Score pairs (in parallel across workers), in order."""
        futures = self.submit_many(pairs)
        # One wake-up for the whole batch: waiting on each future in turn would
        # bounce the GIL between this thread and the dispatcher once per pair.
        remaining = [len(futures)]
        count_lock = threading.Lock()
        done = threading.Event()

        def count(_: Future) -> None:
            with count_lock:
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.set()

        for future in futures:
            future.add_done_callback(count)
        if futures:
            done.wait()
        return [future.result() for future in futures]

    def stats(self) -> dict[str, Any]:
        """Counters since construction: calls, errors (by type), timeouts, mean seconds.

        `errors` counts raised exceptions, bad return values and worker deaths;
        timeouts are counted separately. `mean_seconds` is reward-function time.
        """
        with self._lock:
            return {
                "calls": self._calls,
                "errors": sum(self._error_types.values()),
                "error_types": dict(self._error_types),
                "timeouts": self._timeouts,
                "last_error": self._last_error,
                "first_failures": {k: dict(v) for k, v in self._first_failures.items()},
                "mean_seconds": self._seconds_total / self._calls if self._calls else 0.0,
                "restarts": self._restarts,
                "pending": self._submitted - self._calls - self._cancelled,
            }

    def close(self) -> None:
        """Stop the workers; requests not yet scored fail with RuntimeError or are cancelled."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        self._wake()
        self._thread.join()
        with self._lock:
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_w = -1

    def __enter__(self) -> RewardGuard:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ----------------------------------------------------------------- dispatcher

    def _wake(self) -> None:
        with self._lock:  # never write to a closed (possibly reused) descriptor
            if self._wake_w >= 0:
                with contextlib.suppress(BlockingIOError):
                    os.write(self._wake_w, b"\0")

    def _spawn(self) -> _Worker:
        parent, child = self._ctx.Pipe(duplex=True)
        progress = self._ctx.RawArray("d", 2)
        process = self._ctx.Process(
            target=_worker_main, args=(child, self.fn, progress), name="reward-worker", daemon=True
        )
        process.start()
        child.close()
        return _Worker(process, parent, progress)

    def _run(self) -> None:
        try:
            # Forked here, not in the caller's thread: PR_SET_PDEATHSIG fires when
            # the *forking thread* exits, and this thread lives as long as the guard.
            self._workers = [self._spawn() for _ in range(self.n_workers)]
        except BaseException as exc:
            self._failure = exc
            self._started.set()
            return
        self._started.set()
        try:
            self._loop()
        except BaseException as exc:  # a dispatcher bug must not leave callers waiting
            self._failure = exc
        finally:
            self._shutdown()

    def _loop(self) -> None:
        while True:
            with self._lock:
                if self._closing:
                    return
                assignments = self._take_batches()
            for worker in assignments:
                self._send(worker)
            busy = [w for w in self._workers if w.batch]
            timeout = None
            if busy:
                deadline = min(w.progress[1] for w in busy) + self.timeout_s
                timeout = max(0.0, deadline - time.monotonic())
            ready = wait_for([self._wake_r, *(w.conn for w in busy)], timeout)
            if self._wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
            for worker in busy:
                if worker.conn in ready:
                    self._receive(worker)
            now = time.monotonic()
            for worker in busy:
                if worker.batch and now - worker.progress[1] >= self.timeout_s:
                    self._fail_current(worker, "timeout")

    def _take_batches(self) -> list[_Worker]:
        """Split pending jobs evenly over idle workers (caller holds the lock)."""
        idle = [w for w in self._workers if not w.batch]
        out = []
        for i, worker in enumerate(idle):
            share = min(self.max_batch, -(-len(self._pending) // (len(idle) - i)))  # ceil
            jobs = []
            while self._pending and len(jobs) < share:
                job = self._pending.popleft()
                # Re-queued jobs are already running; new ones may have been cancelled.
                if job.future.running() or job.future.set_running_or_notify_cancel():
                    jobs.append(job)
                else:
                    self._cancelled += 1
            if jobs:
                worker.batch, worker.done = jobs, 0
                out.append(worker)
        return out

    def _send(self, worker: _Worker) -> None:
        worker.progress[0], worker.progress[1] = 0, time.monotonic()
        try:
            worker.conn.send([(job.prompt, job.response) for job in worker.batch])
        except OSError:  # the worker died while idle: nothing ran, so retry elsewhere
            self._restart(worker, requeue=worker.batch)
        except Exception as exc:  # e.g. an unpicklable prompt: fail this batch, keep going
            jobs, worker.batch = worker.batch, []
            for job in jobs:
                self._finish(job, (0.0, "UnsendableInput", _describe(exc), 0.0))

    def _receive(self, worker: _Worker) -> None:
        while worker.batch:
            try:
                if not worker.conn.poll():
                    return
                results = worker.conn.recv()
            except (EOFError, OSError):
                self._fail_current(worker, "died")
                return
            for result in results:
                self._finish(worker.batch[worker.done], result)
                worker.done += 1
            if worker.done == len(worker.batch):
                worker.batch = []

    def _fail_current(self, worker: _Worker, why: str) -> None:
        """Kill the worker, fail the pair it is on, re-queue the rest of its batch."""
        current = worker.current()
        elapsed = time.monotonic() - worker.progress[1]
        self._kill(worker)
        worker.process.join(timeout=1.0)
        if why == "timeout":
            with self._lock:
                self._timeouts += 1
            result = (0.0, None, f"Timeout: reward took longer than {self.timeout_s:g} s", elapsed)
        else:
            code = worker.process.exitcode
            result = (0.0, "WorkerDied", f"reward worker died (exit code {code})", elapsed)
        self._finish(worker.batch[current], result)
        # Pairs before `current` may have finished without their results being sent.
        requeue = worker.batch[worker.done : current] + worker.batch[current + 1 :]
        self._restart(worker, requeue)

    def _kill(self, worker: _Worker) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(worker.process.pid, signal.SIGKILL)  # the worker leads its own group
        with contextlib.suppress(Exception):
            worker.process.kill()
        worker.process.join(timeout=5.0)

    def _restart(self, worker: _Worker, requeue: list[_Job]) -> None:
        """Replace a dead or killed worker in place; its unfinished jobs go back in front."""
        self._kill(worker)
        worker.conn.close()
        fresh = self._spawn()
        worker.process, worker.conn, worker.progress = fresh.process, fresh.conn, fresh.progress
        worker.batch, worker.done = [], 0
        with self._lock:
            self._restarts += 1
            self._pending.extendleft(reversed(requeue))

    def _finish(self, job: _Job, result: tuple) -> None:
        reward, kind, message, seconds = result[:4]
        tb = result[4] if len(result) > 4 else None
        with self._lock:
            self._calls += 1
            self._seconds_total += seconds
            if kind is not None:
                self._error_types[kind] += 1
            if message is not None:
                self._last_error = message
                first = self._first_failures.setdefault(
                    kind or "Timeout",
                    {"message": message, "traceback": tb, "prompt": str(getattr(job.prompt, "text", job.prompt))[:300],
                     "response": job.response[:300]},
                )
                if first["traceback"] is None and tb is not None:  # a restarted worker's first
                    first["traceback"] = tb
        job.future.set_result(RewardOutcome(reward, message, seconds))

    def _shutdown(self) -> None:
        with self._lock:
            self._closing = True
            pending, self._pending = list(self._pending), deque()
        closed = RuntimeError("RewardGuard closed before scoring finished")
        for job in pending:
            if not job.future.cancel():  # re-queued jobs are already running
                job.future.set_exception(closed)
        for worker in self._workers:
            for job in worker.batch[worker.done :]:
                job.future.set_exception(closed)
            worker.batch = []
            with contextlib.suppress(Exception):
                worker.conn.send(None)
        for worker in self._workers:
            worker.process.join(timeout=0.5)
            if worker.process.is_alive():
                self._kill(worker)
            worker.conn.close()
