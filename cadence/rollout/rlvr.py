"""RLVR rollout: prompts in, scored response groups out (queue scheduling).

Every response is its own request to the inference hub (the one generation
path agent episodes use too) and each is scored the moment it finishes; the
engine's continuous batch takes new requests as soon as slots free up. A
group goes to the buffer when its last response is in.

The rollout is driven synchronously, one hub round per `poll()`, from the
rollout worker's thread: requests are submitted to the hub and their results
collected as their futures resolve, on an event loop the rollout owns.

Prompt replication (`replicate=True`, the default): a prompt that needs n
answers becomes n one-answer requests, each taking any free engine slot (and,
with several rollout workers, `answers` of them are this worker's share).
`replicate=False` keeps a prompt one unit, as n>1 sampling does: its n
requests enter the engine together, only once n slots are free.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from transformers import PreTrainedTokenizerBase

from cadence.data.tasks import Prompt
from cadence.inference.hub import InferenceHub
from cadence.inference.types import GenRequest, GenResult, InferenceEngine, SamplingParams
from cadence.rewards.guard import RewardGuard
from cadence.rollout.buffer import SampleBuffer
from cadence.rollout.prompts import PromptStream
from cadence.rollout.sample import Group, Sample


@dataclass
class RolloutStats:
    seconds: float = 0.0
    samples: int = 0
    response_tokens: int = 0
    reward_errors: int = 0
    filtered_groups: int = 0  # dropped by dynamic filtering (no learning signal)
    finish_reasons: dict[str, int] = field(default_factory=dict)


class RLVRRollout:
    def __init__(
        self,
        generator: InferenceHub | InferenceEngine,
        tokenizer: PreTrainedTokenizerBase,
        prompts: PromptStream,
        reward: RewardGuard,
        params: SamplingParams,
        group_size: int,
        first_group_id: int = 0,
        group_id_step: int = 1,
        length_sampler: Callable[[], int] | None = None,
        filter_min_std: float | None = None,
        filter_mean: tuple[float | None, float | None] = (None, None),
        answers: int | None = None,
        replicate: bool = True,
        slots: int | None = None,
    ) -> None:
        # A bare engine is served through a hub of one replica: one generation path either way.
        self.hub = generator if isinstance(generator, InferenceHub) else InferenceHub([generator])
        self.tokenizer = tokenizer
        self.prompts = prompts
        self.reward = reward
        self.params = params
        self.group_size = group_size
        # Several workers fill one batch: ids advance by the worker count, so they never collide.
        self._next_group_id = first_group_id
        self.group_id_step = group_id_step
        self.length_sampler = length_sampler
        self.filter_min_std = filter_min_std
        self.filter_mean = filter_mean
        self.answers = group_size if answers is None else answers  # answers per prompt from this engine
        self.replicate = replicate
        self.slots = slots  # engine slots; needed when groups are admitted whole
        self._unsubmitted: list[tuple[Group, list[int]]] = []  # whole groups waiting for free slots
        self._in_engine = 0  # requests submitted and not finished yet
        self._encoded: dict[str, list[int]] = {}
        self.pending: dict[int, tuple[Prompt, Group]] = {}  # groups with responses still out
        self.positions: dict[int, int] = {}  # group id -> its prompt's stream position (resume)
        self._loop = asyncio.new_event_loop()  # the hub's futures live here; driven by poll()
        self._finished: list[GenResult] = []  # results in the order the hub resolved them

    @property
    def engine(self) -> InferenceEngine:
        """The first replica's engine (the only one when a bare engine was given)."""
        return self.hub.replicas[0].engine

    def encode(self, prompt: Prompt) -> list[int]:
        ids = self._encoded.get(prompt.id)
        if ids is None:
            ids = self.tokenizer(prompt.text).input_ids
            self._encoded[prompt.id] = ids
        return ids

    def admit(self, num_groups: int) -> None:
        """Queue `num_groups` new prompts, `answers` one-answer requests each."""
        for _ in range(num_groups):
            self.positions[self._next_group_id] = self.prompts.peek_position()
            prompt = self.prompts.next()
            group = Group(group_id=self._next_group_id, prompt_id=prompt.id)
            self.pending[group.group_id] = (prompt, group)
            self._next_group_id += self.group_id_step
            self._unsubmitted.append((group, self.encode(prompt)))
        self._loop.run_until_complete(self._submit())

    async def _submit(self) -> None:
        while self._unsubmitted:
            group, ids = self._unsubmitted[0]
            if not self.replicate and self.slots is not None and self._in_engine + self.answers > self.slots:
                if self._in_engine:  # a group larger than the engine still goes when it is empty
                    return
            self._unsubmitted.pop(0)
            for j in range(self.answers):
                req = GenRequest(request_id=f"{group.group_id}/{j}", prompt_ids=ids, params=self._params())
                self.hub.submit(req).add_done_callback(self._collect)
            self._in_engine += self.answers

    def _collect(self, future: asyncio.Future[GenResult]) -> None:
        self._finished.append(future.result())

    def has_work(self) -> bool:
        return bool(self._unsubmitted) or self.hub.has_work()

    def close(self) -> None:
        self._loop.close()

    def keeps(self, group: Group) -> bool:
        """Dynamic filtering: a group whose rewards barely differ (std at most `filter_min_std`),
        or whose mean is at a bound (all wrong / all right), teaches a group-relative estimator
        nothing (all advantages ~0), so it is dropped and a new prompt takes its place."""
        rewards = group.rewards
        mean = sum(rewards) / len(rewards)
        low, high = self.filter_mean
        if (low is not None and mean <= low) or (high is not None and mean >= high):
            return False
        if self.filter_min_std is None:
            return True
        std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
        return std > self.filter_min_std

    def _params(self) -> SamplingParams:
        if self.length_sampler is None:
            return self.params
        # Simulation mode: a forced length, no stop strings, no EOS.
        return replace(self.params, max_new_tokens=self.length_sampler(), stop=[], ignore_eos=True)

    def poll(self, buffer: SampleBuffer, stats: RolloutStats) -> int:
        """One hub round; finished responses are scored at once. Returns groups completed."""
        self._loop.run_until_complete(self._round())
        finished, self._finished = self._finished, []
        before = len(self.pending)
        if finished:
            self._in_engine -= len(finished)
            self._score_into(finished, self.pending, buffer, stats)
            self._loop.run_until_complete(self._submit())
        return before - len(self.pending)

    async def _round(self) -> None:
        await self.hub.pump()
        await asyncio.sleep(0)  # the resolved futures' callbacks run: results reach _finished

    def produce(self, num_groups: int, buffer: SampleBuffer) -> RolloutStats:
        """Generate and score `num_groups` groups into `buffer` (synchronous use)."""
        start = time.perf_counter()
        stats = RolloutStats()
        self.admit(num_groups)
        while self.pending:
            self.poll(buffer, stats)
        stats.seconds = time.perf_counter() - start
        return stats

    def _score_into(
        self,
        results: list[GenResult],
        pending: dict[int, tuple[Prompt, Group]],
        buffer: SampleBuffer,
        stats: RolloutStats,
    ) -> None:
        owners = [pending[int(r.request_id.split("/")[0])] for r in results]
        outcomes = self.reward.score([(prompt, r.text) for (prompt, _), r in zip(owners, results, strict=True)])
        for (_, group), r, outcome in zip(owners, results, outcomes, strict=True):
            group.samples.append(
                Sample(
                    prompt_id=group.prompt_id,
                    group_id=group.group_id,
                    prompt_ids=list(r.prompt_ids),
                    response_ids=list(r.token_ids),
                    behaviour_logprobs=list(r.logprobs),
                    reward=outcome.reward,
                    version=r.version,
                    finish_reason=r.finish_reason,
                    response_text=r.text,
                    finish_version=r.finish_version,
                    reward_error=outcome.error,
                )
            )
            stats.samples += 1
            stats.response_tokens += len(r.token_ids)
            stats.reward_errors += outcome.error is not None
            stats.finish_reasons[r.finish_reason] = stats.finish_reasons.get(r.finish_reason, 0) + 1
            if len(group.samples) == self.answers:
                del pending[group.group_id]
                if self.keeps(group):
                    buffer.put(group)
                else:
                    stats.filtered_groups += 1
