"""RLVR as a one-turn group producer: a prompt in, its scored answers out (queue scheduling).

Every answer is its own `await hub.generate(...)` (the one generation path agent
episodes use too) and is scored the moment it finishes, on the reward guard's
workers, without blocking the loop; the engine's continuous batch takes new
requests as soon as slots free up. A group is done when its last answer is
scored.

Prompt replication (`replicate=True`, the default): a prompt that needs n
answers becomes n one-answer requests, each taking any free engine slot (and,
with several rollout workers, `answers` of them are this worker's share).
`replicate=False` keeps a prompt one unit, as n>1 sampling does: its n
requests enter the engine together, only once n slots are free (first come,
first served).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from cadence.data.tasks import Prompt
from cadence.inference.hub import InferenceHub
from cadence.inference.types import GenRequest, GenResult, SamplingParams
from cadence.rollout.evaluate import EvalResult, pass_at_k
from cadence.rollout.prompts import PromptStream
from cadence.rollout.render import PromptRenderer
from cadence.rollout.sample import Group, Sample


class Outcome(Protocol):
    reward: float
    error: str | None


class Scorer(Protocol):
    """Scores one response; answers finishing together may be scored as one batch."""

    async def score(self, prompt: Prompt, response: str) -> Outcome: ...


class GuardScorer:
    """A `RewardGuard` seen from the loop: the answers that finish in one loop round go to the
    guard's workers as one batch, and their outcomes come back in that order, so samples
    join their groups in the order the engine finished them whatever the workers' timing."""

    def __init__(self, guard: Any) -> None:
        self.guard = guard
        self._batch: list[tuple[Prompt, str, asyncio.Future]] = []

    async def score(self, prompt: Prompt, response: str) -> Outcome:
        loop = asyncio.get_running_loop()
        if not self._batch:
            loop.call_soon(self._send, loop)
        future = loop.create_future()
        self._batch.append((prompt, response, future))
        return await future

    def _send(self, loop: asyncio.AbstractEventLoop) -> None:
        batch, self._batch = self._batch, []
        pending = self.guard.submit_many([(p, r) for p, r, _ in batch])
        futures = [f for _, _, f in batch]
        # One wake-up of the loop per batch, when its last outcome is in (a wake-up per answer
        # cost a self-pipe write and a loop round each).
        left = [len(pending)]
        lock = threading.Lock()

        def one_done(_: concurrent.futures.Future) -> None:
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            try:
                loop.call_soon_threadsafe(_deliver, futures, pending)
            except RuntimeError:  # the loop closed meanwhile: nobody waits for these
                pass

        for outcome in pending:
            outcome.add_done_callback(one_done)

    def report(self) -> dict:
        stats = self.guard.stats()
        return {k: stats[k] for k in ("calls", "errors", "timeouts", "first_failures")}

    def close(self) -> None:
        self.guard.close()


def _deliver(futures: list[asyncio.Future], outcomes: list[concurrent.futures.Future]) -> None:
    for future, outcome in zip(futures, outcomes, strict=True):
        if future.done():
            continue  # its answer was cancelled
        if outcome.exception() is not None:
            future.set_exception(outcome.exception())
        else:
            future.set_result(outcome.result())


def keeps(group: Group, min_std: float | None, mean_low: float | None, mean_high: float | None) -> bool:
    """Dynamic filtering: a group whose rewards barely differ (std at most `min_std`), or whose
    mean is at a bound (all wrong / all right), teaches a group-relative estimator nothing
    (all advantages ~0), so it is dropped and a new prompt takes its place."""
    rewards = group.rewards
    mean = sum(rewards) / len(rewards)
    if (mean_low is not None and mean <= mean_low) or (mean_high is not None and mean >= mean_high):
        return False
    if min_std is None:
        return True
    std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
    return std > min_std


@dataclass
class RolloutStats:
    samples: int = 0
    response_tokens: int = 0
    reward_errors: int = 0
    groups_dropped: int = 0  # by dynamic filtering (no learning signal): never trained
    finish_reasons: dict[str, int] = field(default_factory=dict)


class EngineSlots:
    """Whole-group admission (`replicate=False`): a group's requests enter together once that
    many slots are free, in arrival order; a group larger than the engine goes when it is empty."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.used = 0
        self._waiting: deque[tuple[int, asyncio.Future]] = deque()

    async def take(self, n: int) -> None:
        if not self._waiting and self._fits(n):
            self.used += n
            return
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((n, future))
        await future

    def give_back(self, n: int) -> None:
        self.used -= n
        while self._waiting and self._fits(self._waiting[0][0]):
            n, future = self._waiting.popleft()
            if not future.cancelled():  # a group cancelled while it waited takes nothing
                self.used += n
                future.set_result(None)

    def _fits(self, n: int) -> bool:
        return self.used == 0 or self.used + n <= self.slots


class RLVRProducer:
    """Groups of answers to the task's prompts (see the module docstring)."""

    needs_running_loop = False
    first_key = 0  # a key is a stream position

    def __init__(
        self,
        hub: InferenceHub,
        render: PromptRenderer,
        stream: PromptStream,
        scorer: Scorer,
        params: SamplingParams,
        answers: int,
        *,
        replicate: bool = True,
        slots: int | None = None,
        length_sampler: Callable[[], int] | None = None,
        keep: Callable[[Group], bool] = lambda group: True,
        eval_prompts: Callable[[], list[Prompt]] = list,
        eval_params: SamplingParams | None = None,
    ) -> None:
        self.hub = hub
        self.render = render  # prompt -> the ids the engine sees (chat template or raw text)
        self.stream = stream
        self.scorer = scorer
        self.params = params
        self.answers = answers  # answers per prompt from this worker (its share when replicated)
        self.slots = EngineSlots(slots) if not replicate and slots is not None else None
        self.length_sampler = length_sampler
        self.keep = keep
        self.eval_prompts = eval_prompts
        self.eval_params = eval_params or params
        self.stats = RolloutStats()

    async def start(self) -> None:
        pass  # the hub is all it needs

    async def play(self, key: int, group_id: int) -> Group | None:
        prompt = self.stream.at(key)
        ids = self.render.ids(prompt)
        group = Group(group_id=group_id, prompt_id=prompt.id)
        if self.slots is not None:
            await self.slots.take(self.answers)

        async def answer(j: int) -> None:
            request_id = f"{group_id}/{j}"
            try:
                result = await self.hub.generate(GenRequest(request_id, ids, self._params()))
            except asyncio.CancelledError:
                self.hub.abort(request_id)  # free its engine slot
                raise
            finally:
                if self.slots is not None:
                    self.slots.give_back(1)
            outcome = await self.scorer.score(prompt, result.text)
            group.samples.append(self._sample(group, result, outcome))

        await asyncio.gather(*(answer(j) for j in range(self.answers)))
        if self.keep(group):
            return group
        self.stats.groups_dropped += 1
        return None

    def on_weights(self, version: int, cancel_before: int | None) -> None:
        pass  # an answer's version is the one that started it: the engine's, in its result

    async def evaluate(self, samples: int) -> EvalResult:
        """pass@1 and pass@k on the task's held-out prompts (k = `samples`)."""
        prompts = self.eval_prompts()

        async def correct(i: int, prompt: Prompt) -> list[float]:
            ids = self.render.ids(prompt)
            results = await asyncio.gather(*(
                self.hub.generate(GenRequest(f"eval/{i}/{j}", ids, self.eval_params)) for j in range(samples)
            ))
            outcomes = await asyncio.gather(*(self.scorer.score(prompt, r.text) for r in results))
            return [o.reward for o in outcomes]

        rewards = await asyncio.gather(*(correct(i, p) for i, p in enumerate(prompts)))
        return eval_result([sum(r >= 1.0 for r in rs) for rs in rewards], samples, [r for rs in rewards for r in rs])

    def metrics(self) -> dict[str, float]:
        return {
            "rollout/reward_errors_total": float(self.stats.reward_errors),
            "rollout/samples_total": float(self.stats.samples),
            "rollout/groups_dropped_total": float(self.stats.groups_dropped),
            "rollout/filtered_groups_total": float(self.stats.groups_dropped),  # its old name, for a release
        }

    def health(self) -> dict:
        """The reward function's counters and first failures."""
        report = getattr(self.scorer, "report", None)
        return {"reward": report() if report else {"calls": 0, "errors": 0, "timeouts": 0, "first_failures": {}}}

    async def stop(self) -> None:
        pass  # a cancelled group aborts its own requests

    def close(self) -> None:
        close = getattr(self.scorer, "close", None)
        if close:
            close()

    # -- internals ----------------------------------------------------------------
    def _params(self) -> SamplingParams:
        if self.length_sampler is None:
            return self.params
        # Simulation mode: a forced length, no stop strings, no EOS.
        return replace(self.params, max_new_tokens=self.length_sampler(), stop=[], ignore_eos=True, stop_token_ids=[])

    def _sample(self, group: Group, r: GenResult, outcome: Outcome) -> Sample:
        self.stats.samples += 1
        self.stats.response_tokens += len(r.token_ids)
        self.stats.reward_errors += outcome.error is not None
        self.stats.finish_reasons[r.finish_reason] = self.stats.finish_reasons.get(r.finish_reason, 0) + 1
        return Sample(
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


def eval_result(correct: list[int], samples: int, rewards: list[float]) -> EvalResult:
    """pass@1 and pass@`samples` over prompts (`correct[i]` of `samples` right), mean reward."""
    return EvalResult(
        pass_at_1=sum(pass_at_k(samples, c, 1) for c in correct) / len(correct),
        pass_at_k=sum(pass_at_k(samples, c, samples) for c in correct) / len(correct),
        k=samples,
        mean_reward=sum(rewards) / len(rewards),
        prompts=len(correct),
    )
