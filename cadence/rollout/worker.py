"""A rollout worker: an engine, a reward guard and a prompt stream, generating on its own.

The worker runs the producer half of the pipeline in a background thread:
admit prompts -> engine steps -> score each finished response at once ->
complete groups into its `SampleBuffer`. The trainer pulls batches with
`get_batch` and pushes weights with `update_weights`.

Admission implements the asynchronous ratio alpha (ROLL Flash): a worker
that has received s weight pushes (one per trainer step) may have started at
most (s + alpha + 1) x quota groups in total, where quota is its share of the
prompts per step. Groups are consumed in order, one quota per trainer step,
so every group is trained on at most alpha steps after the one that started
it; alpha = 0 is synchronous training. s is the policy version v, except
while the trainer pushes unchanged weights (critic warm-up): versions change
only with weights, so those steps cost no staleness. A request in flight when new
weights arrive keeps its tokens and finishes under the new weights with its
original version tag (interruptible generation, as in AReaL and ROLL).

The same class runs in-process (`runtime.kind=inline`) or as a Ray actor
(`runtime.kind=ray`), so there is one code path for a laptop and a cluster.
"""

from __future__ import annotations

import math
import random
import threading
import time
import traceback

import torch

from cadence.config import RunConfig
from cadence.data.tasks import build_task
from cadence.inference.config import build_engine
from cadence.inference.hub import InferenceHub
from cadence.inference.prefix_reuse import reuse_metrics
from cadence.inference.types import SamplingParams
from cadence.models.loading import load_policy, load_tokenizer
from cadence.observe.events import Timeline
from cadence.rewards.guard import RewardGuard
from cadence.rewards.verifiers import build_reward
from cadence.rollout.buffer import SampleBuffer
from cadence.rollout.evaluate import EvalResult, evaluate
from cadence.rollout.prompts import PromptStream
from cadence.rollout.rlvr import RLVRRollout, RolloutStats
from cadence.rollout.sample import Group
from cadence.runtime.threads import configure_threads


def worker_quotas(prompts_per_step: int, workers: int) -> list[int]:
    """Split the prompts of one step over workers as evenly as possible."""
    base, extra = divmod(prompts_per_step, workers)
    return [base + (i < extra) for i in range(workers)]


class RolloutWorker:
    def __init__(
        self, cfg: RunConfig, index: int = 0, workers: int = 1, threads: int = 0, background: bool = True
    ) -> None:
        self.threads = configure_threads(threads)
        # background=False: no generation thread; get_batch generates in the caller's thread.
        # Synchronous training in one process uses this: generation and training alternate
        # anyway, and torch ops from a second thread would bring a second OpenMP thread team
        # that competes with the trainer's for the same cores.
        self.background = background
        self.cfg = cfg
        self.index = index
        ro = cfg.rollout
        # Prompt replication over workers: every worker takes every prompt and generates its
        # share of the answers (answer j on worker j mod W); WorkerGroup joins the parts.
        self.spread = ro.replicate_prompts and workers > 1
        self.quota = ro.prompts_per_step if self.spread else worker_quotas(ro.prompts_per_step, workers)[index]
        self.answers = len(range(index, ro.group_size, workers)) if self.spread else ro.group_size
        self.alpha = ro.async_ratio
        filtering = ro.filter_min_std is not None or ro.filter_mean_low is not None or ro.filter_mean_high is not None
        self.extra = ro.extra_prompts if filtering else 0
        self.tokenizer = load_tokenizer(cfg.model.path)
        self.engine = build_engine(cfg.rollout.engine, load_policy(cfg.model.path).eval(), self.tokenizer)
        self.hub = InferenceHub([self.engine])  # every request, training or evaluation, goes through it
        self.task = build_task(cfg.task)
        self.reward = RewardGuard(build_reward(cfg.reward, self.task), cfg.reward.timeout_s, cfg.reward.workers)
        stop = cfg.rollout.stop if cfg.rollout.stop is not None else list(self.task.stop)
        self.params = SamplingParams(
            max_new_tokens=cfg.rollout.max_new_tokens,
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
            stop=stop,
        )
        self.eval_params = SamplingParams(
            max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.eval.temperature, stop=stop
        )
        # Exactly the prompts this run will use (this worker's stride of them), so the
        # stream's cursor pins down the data order across restarts.
        needed = cfg.trainer.steps * ro.prompts_per_step
        prompts = self.task.prompts("train", needed, cfg.seed)
        if not self.spread:
            prompts = prompts[index::workers] or prompts[:1]
        self.stream = PromptStream(prompts, cfg.seed if self.spread else cfg.seed + index)
        self.rollout = RLVRRollout(
            self.hub, self.tokenizer, self.stream, self.reward, self.params, ro.group_size,
            first_group_id=0 if self.spread else index, group_id_step=1 if self.spread else workers,
            length_sampler=self._length_sampler(cfg, index),
            filter_min_std=ro.filter_min_std, filter_mean=(ro.filter_mean_low, ro.filter_mean_high),
            answers=self.answers, replicate=ro.replicate_prompts, slots=ro.engine.max_batch_size,
        )
        self.buffer = SampleBuffer(self.alpha)
        self.version = 0
        self.swaps = 0  # weight pushes applied: the admission clock (one per trainer step)
        self.started_groups = 0  # groups admitted since the run began (all versions)
        self.handed_out = 0  # groups given to the trainer
        # Stream positions of prompts trained on: all below `trained_below`, plus these above it.
        # Groups finish out of order (and some are filtered or dropped), so a cursor alone
        # cannot say which prompts a resumed run still owes the trainer.
        self.trained_below = 0
        self.trained_above: set[int] = set()
        self.stats = RolloutStats()
        self.interrupt = ro.interrupt_on_update
        self._lock = threading.Lock()  # the engine: one user at a time
        self._slot_lock = threading.Lock()  # only guards _new_weights; held for nanoseconds
        self._wake = threading.Event()  # new weights or stop: the idle generation loop goes on
        self._new_weights: tuple[dict[str, torch.Tensor], int] | None = None  # waiting for a swap
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: str | None = None
        self._born = time.perf_counter()
        # The pipeline view of `cadence dashboard`: spans of generating / waiting / weight_sync.
        self.timeline = Timeline(cfg.run_dir() if cfg.logging.events else None, f"rollout-{index}")

    @staticmethod
    def _length_sampler(cfg: RunConfig, index: int):
        sim = cfg.rollout.simulate_lengths
        if sim is None:
            return None
        rng = random.Random(cfg.seed * 7919 + index)
        return lambda: max(1, min(sim.max_tokens, round(rng.lognormvariate(math.log(sim.median_tokens), sim.sigma))))

    # -- the producer loop ---------------------------------------------------
    def start(self) -> None:
        if self._thread is None and self.background:
            self._thread = threading.Thread(target=self._run, name=f"rollout-{self.index}", daemon=True)
            self._thread.start()

    def _allowed_groups(self) -> int:
        # Filtered groups never reach the buffer, so they do not use up the allowance; extra
        # prompts in flight keep the batch full while some groups are being filtered out.
        return (self.swaps + self.alpha + 1) * self.quota + self.stats.filtered_groups + self.extra

    def _tick(self) -> bool:
        """One round of the producer: swap in queued weights, admit what alpha allows, one
        engine step (its finished answers scored). False when there was nothing to do."""
        with self._lock:
            self._swap_weights()
            room = self._allowed_groups() - self.started_groups
            if room > 0 and self._new_weights is None:
                self.rollout.admit(room)
                self.started_groups += room
            busy = self.rollout.has_work()
            self.timeline.enter("generating" if busy else "waiting")
            if busy:
                self.rollout.poll(self.buffer, self.stats)
        return busy

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._tick():
                    # Nothing may start until new weights arrive: block instead of polling, since a
                    # thread waking every few ms steals a core from the trainer's torch threads.
                    self._wake.wait(timeout=1.0)
                    self._wake.clear()
        except Exception:  # surfaced to the trainer on its next call, not lost in a thread
            self._error = traceback.format_exc()

    def _swap_weights(self, force: bool = False) -> None:
        """Load queued weights between two engine steps (caller holds the lock).

        Interruptible (default): at once; requests in flight continue under the new
        weights with their tokens, log-probs and original version tag. Otherwise the
        engine first finishes what it holds on the old weights, admitting nothing new.
        """
        if not (force or self.interrupt) and self.rollout.has_work():
            return
        with self._slot_lock:
            new, self._new_weights = self._new_weights, None
        if new is None:
            return
        state_dict, version = new
        self.timeline.enter("weight_sync")
        self.hub.update_weights(state_dict, version)
        self.hub.apply_weights()  # between two rounds: nothing is stepping now
        self.version = version
        self.swaps += 1

    def _check(self) -> None:
        if self._error:
            raise RuntimeError(f"rollout worker {self.index} failed:\n{self._error}")

    # -- what the trainer calls ------------------------------------------------
    def get_batch(self, trainer_version: int, timeout: float = 600.0) -> list[Group]:
        """This worker's quota of fresh groups for `trainer_version` (blocks)."""
        deadline = time.perf_counter() + timeout
        while True:
            self._check()
            try:
                batch = self.buffer.get_batch(self.quota, trainer_version, timeout=0 if not self.background else 0.05)
                if not self.background:
                    self.timeline.enter("waiting")  # generation pauses while the caller trains
                self.handed_out += len(batch)
                self._mark_trained(batch)
                return batch
            except TimeoutError:
                if time.perf_counter() > deadline:
                    raise
                if not self.background and not self._tick():
                    raise RuntimeError(f"rollout worker {self.index}: idle with an incomplete batch") from None

    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Queue new weights and return at once: the generation loop swaps them in between
        two engine steps, so the trainer never queues behind the engine (a lock the loop
        takes back-to-back would starve it). Not generating (before `start`, after `stop`):
        swapped in now. The tensors must not change afterwards (WorkerGroup sends copies)."""
        with self._slot_lock:
            self._new_weights = (state_dict, version)
        self._wake.set()
        if self._thread is None:
            with self._lock:
                self._swap_weights(force=True)

    def evaluate(self, samples: int = 1) -> EvalResult:
        test = self.task.prompts("test", self.cfg.task.test_size, self.cfg.seed)
        with self._lock:
            # Evaluate the newest policy: weights queued for a generating worker go in first.
            self._swap_weights(force=True)
            self.timeline.enter("evaluating")
            return evaluate(self.hub, self.tokenizer, test, self.reward, self.eval_params, samples)

    def metrics(self) -> dict[str, float]:
        engine = self.engine.stats()
        wall = time.perf_counter() - self._born
        return {
            **self.buffer.stats(),
            "rollout/engine_busy_fraction": engine.get("busy_s", 0.0) / max(wall, 1e-9),
            "rollout/engine_busy_s": engine.get("busy_s", 0.0),
            "rollout/engine_steps": float(engine.get("decode_steps", engine.get("engine_steps", 0))),
            "rollout/reward_errors_total": float(self.stats.reward_errors),
            "rollout/samples_total": float(self.stats.samples),
            "rollout/in_flight_groups": float(len(self.rollout.pending)),
            "rollout/filtered_groups_total": float(self.stats.filtered_groups),
            **reuse_metrics(engine),
        }

    def reward_report(self) -> dict:
        """The reward guard's counters and the first failure of each kind (with its traceback)."""
        stats = self.reward.stats()
        return {k: stats[k] for k in ("calls", "errors", "timeouts", "first_failures")}

    def _mark_trained(self, groups: list[Group]) -> None:
        with self._lock:  # positions are written by the generation thread at admission
            positions = [self.rollout.positions.pop(g.group_id) for g in groups]
        self.trained_above.update(positions)
        while self.trained_below in self.trained_above:
            self.trained_above.discard(self.trained_below)
            self.trained_below += 1

    def state_dict(self) -> dict:
        """Where to resume: every prompt not trained on yet is owed, in stream order.

        Groups still in flight, waiting in the buffer, filtered or dropped as stale were
        never trained on, so a resumed run generates them again; prompts trained on are
        never generated twice, in whatever order their groups finished.
        """
        state = {
            "prompts": {"cursor": self.trained_below, "skip": sorted(self.trained_above)},
            "next_group_id": self.rollout._next_group_id,
            "swaps": self.swaps,
        }
        # The engine's sampling RNG: with it a synchronous run resumes bit-identically (nothing is
        # in flight between steps). Asynchronous runs regenerate in-flight groups, so theirs differ.
        with self._lock:
            state["engine"] = self.engine.sampling_state()
        return state

    def load_state_dict(self, state: dict, version: int) -> None:
        """Resume at trainer `version` with nothing in flight."""
        self.stream.load_state_dict(state["prompts"])
        self.trained_below, self.trained_above = self.stream.cursor, set(self.stream.skip)
        if "engine" in state:  # absent from checkpoints written before it was saved
            with self._lock:
                self.engine.load_sampling_state(state["engine"])
        self.rollout._next_group_id = state["next_group_id"]
        self.version = version
        self.swaps = state.get("swaps", version)  # older checkpoints: one push per version
        self.started_groups = self.swaps * self.quota

    def stop(self) -> None:
        """Stop generating; the engine and reward guard stay usable (final evaluation)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def close(self) -> None:
        self.stop()
        self.reward.close()
        self.rollout.close()
        self.timeline.close()
