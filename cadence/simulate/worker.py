"""The simulated rollout workers: cadence's `RolloutWorker`, over mock replicas on virtual time.

Admission under the asynchronous ratio, the weight slot, the buffer, and the
producers beneath (RLVR's queue scheduling and prompt replication, episodes'
redundancy, retries and lock-step) are the real ones, run unchanged on the
simulator's virtual-time loop. Only what a real worker loads (a model, a
tokenizer, a task, a reward function, an environment) is replaced by
stand-ins that cost nothing (stand_ins.py).
"""

from __future__ import annotations

import asyncio
import random

from cadence.data.tasks import Prompt
from cadence.inference.mock import MockEngine
from cadence.inference.types import SamplingParams
from cadence.rewards.guard import RewardOutcome
from cadence.rollout.buffer import SampleBuffer
from cadence.rollout.prompts import PromptStream
from cadence.rollout.render import PromptRenderer
from cadence.rollout.rlvr import RLVRProducer
from cadence.rollout.sample import Group
from cadence.rollout.worker import RolloutWorker
from cadence.simulate.stand_ins import LengthTokenizer, blank_prompts
from cadence.simulate.virtual_asyncio import VirtualTimeHub


class CoinScorer:  # the stand-in reward
    """Scores a response 1 or 0 at random (seeded), at once: the time it takes is not modelled."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    async def score(self, prompt: Prompt, response: str) -> RewardOutcome:
        return RewardOutcome(float(self._rng.random() < 0.5))


class SignalledBuffer(SampleBuffer):
    """A SampleBuffer that also wakes the simulated trainer when a group arrives."""

    def __init__(self, async_ratio: int, arrived: asyncio.Event) -> None:
        super().__init__(async_ratio)
        self.arrived = arrived

    def put(self, group: Group) -> None:
        super().put(group)
        self.arrived.set()


def sim_worker(index: int, hub: VirtualTimeHub, producer: object, quota: int, alpha: int,
               arrived: asyncio.Event, extra: int = 0) -> RolloutWorker:
    """The real worker over `producer` on `hub`; groups it completes wake the trainer."""
    worker = RolloutWorker(producer, hub, quota=quota, alpha=alpha, extra=extra, index=index)  # type: ignore[arg-type]
    worker.buffer = SignalledBuffer(alpha, arrived)
    return worker


def rlvr_worker(index: int, engines: list[MockEngine], quota: int, group_size: int, alpha: int,
                arrived: asyncio.Event, prompt_ticks: int, max_ticks: int, replicate: bool = True,
                seed: int = 0) -> RolloutWorker:
    """An RLVR rollout worker: blank prompts of `prompt_ticks` ids, answers of the engines'
    lengths, coin-flip rewards."""
    hub = VirtualTimeHub(engines)
    producer = RLVRProducer(
        hub, PromptRenderer(LengthTokenizer(prompt_ticks)), PromptStream(blank_prompts(max(1, quota)), seed), CoinScorer(seed),
        SamplingParams(max_new_tokens=max_ticks), group_size, replicate=replicate,
        slots=sum(e.max_batch_size for e in engines),
    )
    return sim_worker(index, hub, producer, quota, alpha, arrived)
