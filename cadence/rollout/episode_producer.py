"""Environment-level async rollout: one coroutine per episode, groups of episodes on one seed.

A group is `group_size` episodes that start from the same environment seed
(GRPO compares their returns). Every episode is its own coroutine on the
shared hub (`run_episode`), so a slow environment delays its own episode and
nothing else: no barrier across episodes, turns or groups.

Redundant environments (ROLL Flash): with `redundancy` r > 0 a group starts
`group_size + r` episodes and closes with the first `group_size` that finish;
the stragglers are cancelled (their engine requests aborted). A fail-slow or
fail-stop environment then costs nothing but its own slot.

A lost episode (its environment raised, hung past its timeout or died) is
counted and replaced by a new episode on the same seed, up to `max_retries`
per group; a group that runs out of retries is dropped and counted, and its
prompt slot goes to a new group, so training never waits on a dead one.

It is the rollout worker's multi-turn `GroupProducer` (cadence.rollout.producer):
a key is a seed; the worker picks it (counting up from `first_seed`) and awaits
`play(seed, group_id)`.
Admission under the async ratio is the worker's, the same rule as for RLVR
prompts: groups are held back, finished episodes are never thrown away for
being stale. Held-out evaluation plays `eval_episodes` episodes on seeds that
training never uses (training seeds count up from `first_seed`, held-out ones
from 10**9).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from cadence.envs.runner import EnvRunner
from cadence.inference.hub import InferenceHub
from cadence.inference.types import SamplingParams
from cadence.rollout.episode import Episode, PlainTurns, TurnFormat, run_episode
from cadence.rollout.evaluate import EvalResult
from cadence.rollout.failures import Failures, OpenGroup, ProducerFailing, stale
from cadence.rollout.rlvr import eval_result
from cadence.rollout.sample import Group

HELD_OUT_SEED = 10**9


@dataclass(kw_only=True)
class _OpenGroup(OpenGroup):
    group: Group
    seed: int
    done: asyncio.Future  # the group, or None when it will never train
    started: int = 0


class EpisodeProducer:
    """Episodes in flight for open groups (see the module docstring)."""

    needs_running_loop = True  # episodes wait on environments: the loop turns while the trainer trains

    def __init__(
        self,
        hub: InferenceHub,
        make_runner: Callable[[], EnvRunner],
        tokenizer: PreTrainedTokenizerBase,
        params: SamplingParams,
        group_size: int,
        redundancy: int = 0,
        max_retries: int | None = None,
        max_context_tokens: int = 2048,
        turns: TurnFormat = PlainTurns(),
        first_seed: int = 0,
        eval_params: SamplingParams | None = None,
        eval_episodes: int = 0,
        failures: Failures | None = None,
    ) -> None:
        self.hub = hub
        self.make_runner = make_runner
        self.tokenizer = tokenizer
        self.params = params
        self.eval_params = eval_params or params
        self.eval_episodes = eval_episodes
        self.group_size = group_size
        self.redundancy = redundancy
        self.max_context_tokens = max_context_tokens
        self.turns = turns
        self.first_key = first_seed  # a key is a seed
        self.version = 0  # the policy version new groups start under (set on each weight swap)
        self.open: dict[int, _OpenGroup] = {}
        self.turn_total = 0
        self.stale_cancelled = 0  # groups closed because they could only go stale
        # Lost episodes, retries, dropped groups; the first failure of each kind shown once.
        self.failures = failures or Failures("the environment", echo=False)
        self.max_retries = 2 * group_size if max_retries is None else max_retries

    # -- the producer protocol -------------------------------------------------
    async def start(self) -> None:
        pass  # environments are made per episode

    async def play(self, key: int, group_id: int) -> Group | None:
        """Play one group of episodes on seed `key` (call inside the event loop)."""
        return await self._open(key, group_id)

    def on_weights(self, version: int, cancel_before: int | None) -> None:
        self.version = version
        if cancel_before is not None:
            self.cancel_stale(cancel_before)

    async def evaluate(self, samples: int) -> EvalResult:
        """Held-out success: `eval_episodes` episodes (x `samples`) on seeds never trained on."""
        seeds = [HELD_OUT_SEED + i for i in range(self.eval_episodes)]
        returns = await asyncio.gather(*(
            self._held_out_episode(seed, f"eval/{i}/{j}") for i, seed in enumerate(seeds) for j in range(samples)
        ))
        correct = [sum(r >= 1.0 for r in returns[i * samples : (i + 1) * samples]) for i in range(len(seeds))]
        return eval_result(correct, samples, list(returns))

    def metrics(self) -> dict[str, float]:
        failures = self.failures
        out = {
            "rollout/episodes_total": float(failures.played),
            "rollout/episodes_in_flight": float(self.in_flight()),
            "rollout/episodes_cancelled_total": float(failures.cancelled),
            "rollout/episodes_retried_total": float(failures.retried),
            "rollout/groups_dropped_total": float(failures.groups_dropped),
            "rollout/groups_stale_cancelled_total": float(self.stale_cancelled),
            "rollout/turns_per_episode": self.turn_total / max(failures.played, 1),
        }
        for kind in ("raised", "timeout", "died"):
            out[f"rollout/episodes_lost_{kind}_total"] = float(failures.lost_by_kind[kind])
        return out

    def health(self) -> dict:
        """Episodes played, lost, retried; groups dropped; the first failure of each kind (rewards
        come from the environment: no reward function to fail)."""
        return {"episodes": self.failures.health()}

    def in_flight(self) -> int:
        # A copy in one step: metrics are read from the trainer's thread while the loop's changes them.
        return sum(len(g.plays) for g in list(self.open.values()))

    def cancel_stale(self, min_version: int) -> int:
        """Close the open groups started before `min_version` (they could only be dropped as
        stale once finished), cancelling their episodes; returns how many closed."""
        closing = stale(self.open, min_version)
        for opened in closing:
            self._close(opened, keep=False, stale=True)
        return len(closing)

    def close(self) -> None:
        pass  # environments are made and closed per episode

    async def stop(self) -> None:
        """Cancel every episode still running (their requests are aborted)."""
        # Out of `open` first: an episode that ends while the others are being cancelled is late,
        # not the last of a short group to be counted as dropped.
        groups = list(self.open.values())
        self.open.clear()
        tasks = [t for g in groups for t in g.plays]
        for task in tasks:
            task.cancel()
        for opened in groups:
            if not opened.done.done():
                opened.done.set_result(None)
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- internals ------------------------------------------------------------
    def _open(self, seed: int, group_id: int) -> asyncio.Future:
        done = asyncio.get_running_loop().create_future()
        opened = _OpenGroup(self.version, group=Group(group_id=group_id, prompt_id=f"seed{seed}"), seed=seed, done=done)
        self.open[group_id] = opened
        for _ in range(self.group_size + self.redundancy):
            self._start(opened)
        return done

    def _start(self, opened: _OpenGroup) -> None:
        episode_id = f"g{opened.group.group_id}/e{opened.started}"
        opened.started += 1
        task = asyncio.ensure_future(self._episode(opened, episode_id))
        opened.plays.add(task)
        task.add_done_callback(opened.plays.discard)

    async def _episode(self, opened: _OpenGroup, episode_id: str) -> None:
        await self._run(opened, episode_id, self.make_runner)

    async def _run(self, opened: _OpenGroup, episode_id: str, make_runner: Callable[[], EnvRunner]) -> None:
        runner = make_runner()
        try:
            episode = await run_episode(
                self.hub, runner, self.tokenizer, self.params, opened.seed, episode_id,
                group_id=opened.group.group_id, turns=self.turns, max_context_tokens=self.max_context_tokens,
            )
        except asyncio.CancelledError:
            self.failures.cancelled += 1
            raise
        finally:
            await runner.close()
        self._finished(opened, episode)

    async def _held_out_episode(self, seed: int, episode_id: str) -> float:
        runner = self.make_runner()
        try:
            episode = await run_episode(
                self.hub, runner, self.tokenizer, self.eval_params, seed, episode_id, turns=self.turns,
                max_context_tokens=self.max_context_tokens,
            )
        finally:
            await runner.close()
        return sum(episode.rewards) if episode.ok else 0.0

    def _finished(self, opened: _OpenGroup, episode: Episode) -> None:
        group = opened.group
        # This episode is over: take it out of the live set now (its task's done callback would
        # only run later, and episodes that end in the same round must see each other gone).
        opened.plays.discard(asyncio.current_task())
        if group.group_id not in self.open:
            return  # the group closed meanwhile (a late straggler)
        self.turn_total += episode.turns
        if episode.first_too_long is not None:
            self.failures.finished()
            self._stop_run(self._too_long(episode.first_too_long))
            return
        if episode.ok:
            self.failures.finished()
            group.samples.append(episode.sample)
        else:
            assert episode.failure is not None
            self.failures.record_lost(episode.failure, opened.seed)
            if self.failures.retry(opened, self.max_retries):
                self._start(opened)
        if len(group.samples) == self.group_size:
            self._close(opened, keep=True)
        elif not opened.plays:
            # Short and nothing left running: its retries are spent, whichever of its episodes
            # ended last (a lost one, or one that finished after a lost one found no retry left).
            self._close(opened, keep=False)
        try:
            self.failures.check()
        except ProducerFailing as failing:
            self._stop_run(failing)

    def _too_long(self, tokens: int) -> ProducerFailing:
        """A first observation that leaves no room for a turn: every seed would fail the same way."""
        new, budget = self.params.max_new_tokens, self.max_context_tokens
        return ProducerFailing(
            f"env.name={self.failures.name}: the first observation is {tokens} tokens, and a turn needs "
            f"rollout.max_new_tokens={new} more: {tokens + new} > the context budget {budget} "
            f"(rollout.max_context_tokens, capped at the model's max_position_embeddings); shorten the "
            f"observation, lower rollout.max_new_tokens or raise rollout.max_context_tokens"
        )

    def _stop_run(self, error: Exception) -> None:
        """The environment is broken: every group fails with `error`, and the worker stops the run."""
        groups = list(self.open.values())
        self.open.clear()
        for opened in groups:
            for task in opened.plays:
                if task is not asyncio.current_task():
                    task.cancel()
            if not opened.done.done():
                opened.done.set_exception(error)

    def _close(self, opened: _OpenGroup, keep: bool, stale: bool = False) -> None:
        del self.open[opened.group.group_id]
        for task in list(opened.plays):
            if task is not asyncio.current_task():
                task.cancel()  # stragglers: run_episode aborts their requests
        if stale:
            self.stale_cancelled += 1
        else:
            self.failures.group_ended(kept=keep)
        if not opened.done.done():
            opened.done.set_result(opened.group if keep else None)
