"""A rollout worker whose engine replicas are mock engines costed like GPUs.

It *is* cadence's `RolloutWorker` (a subclass): admission under the
asynchronous ratio alpha (`_allowed_groups`), the producer round (`_tick`:
swap queued weights, admit, one hub round, score what finished), interruptible
weight swaps (`_swap_weights`, `update_weights`) and the whole `RLVRRollout`
beneath it (queue scheduling, prompt replication, the hub's least-loaded
routing over the worker's replicas) run unchanged. Only what a real worker
loads in its constructor (a model, a tokenizer, a task, a reward guard) is
replaced by stand-ins, so the constructor is the simulator's own.

The simulator drives `step()` from its event queue instead of a thread: one
call is one producer round, and it returns how long that round took on the
replicas (they step in parallel, so the slowest one's step).
"""

from __future__ import annotations

import threading

from cadence.inference.hub import InferenceHub
from cadence.inference.mock import MockEngine
from cadence.inference.types import SamplingParams
from cadence.rollout.buffer import SampleBuffer
from cadence.rollout.prompts import PromptStream
from cadence.rollout.rlvr import RLVRRollout, RolloutStats
from cadence.rollout.sample import Group
from cadence.rollout.worker import RolloutWorker
from cadence.simulate.stand_ins import CoinReward, LengthTokenizer, blank_prompts

NEVER_STALE = 10**9


class NoTimeline:
    """The dashboard's span recorder, switched off: virtual time has no wall-clock spans."""

    def enter(self, state: str, step: int | None = None) -> None:
        pass

    def record(self, **fields: object) -> None:
        pass

    def close(self) -> None:
        pass


class SimRolloutWorker(RolloutWorker):
    def __init__(
        self,
        index: int,
        engines: list[MockEngine],
        quota: int,
        group_size: int,
        alpha: int,
        prompt_ticks: int,
        max_ticks: int,
        replicate: bool = True,
        seed: int = 0,
    ) -> None:
        # Not RolloutWorker.__init__: it loads a model, tokenizer, task and reward guard. The
        # fields below are the ones the inherited scheduling methods use, set as it sets them.
        self.index = index
        self.background = True
        self.spread = False
        self.quota = quota
        self.answers = group_size
        self.alpha = alpha
        self.extra = 0  # no dynamic filtering in the simulator
        self.engines = engines
        self.engine = engines[0]
        self.hub = InferenceHub(engines)
        self.reward = CoinReward(seed)
        self.params = SamplingParams(max_new_tokens=max_ticks)
        self.stream = PromptStream(blank_prompts(max(1, quota)), seed)
        self.rollout = RLVRRollout(
            self.hub, LengthTokenizer(prompt_ticks), self.stream, self.reward, self.params, group_size,
            answers=group_size, replicate=replicate, slots=sum(e.max_batch_size for e in engines),
        )
        # Groups land here during a round; the simulator hands them to the trainer when the
        # round's engine step ends in virtual time (not when Python computed it).
        self.buffer = SampleBuffer(NEVER_STALE)
        self.version = 0
        self.swaps = 0
        self.started_groups = 0
        self.handed_out = 0
        self.trained_below = 0
        self.trained_above: set[int] = set()
        self.stats = RolloutStats()
        self.interrupt = True
        self._lock = threading.Lock()
        self._slot_lock = threading.Lock()
        self._wake = threading.Event()
        self._new_weights = None
        self._stop = threading.Event()
        self._thread = None
        self._error = None
        self._born = 0.0
        self.timeline = NoTimeline()

    def step(self) -> tuple[bool, float]:
        """One producer round; (False: nothing to do until new weights, its seconds)."""
        before = [e.clock() for e in self.engines]
        busy = self._tick()
        return busy, max(e.clock() - b for e, b in zip(self.engines, before, strict=True))

    def take_finished(self) -> list[Group]:
        """The groups the last round completed."""
        return self.buffer.get_batch(len(self.buffer), 0, timeout=0)

    def busy_seconds(self) -> float:
        return sum(e.stats()["busy_s"] for e in self.engines)
