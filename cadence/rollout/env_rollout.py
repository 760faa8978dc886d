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

Admission under the async ratio is the caller's (the rollout worker's), the
same rule as for RLVR prompts: groups are held back, finished episodes are
never thrown away for being stale.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from cadence.envs.runner import EnvRunner
from cadence.inference.hub import InferenceHub
from cadence.inference.types import SamplingParams
from cadence.rollout.buffer import SampleBuffer
from cadence.rollout.episode import Episode, PlainTurns, TurnFormat, run_episode
from cadence.rollout.sample import Group


@dataclass
class _OpenGroup:
    group: Group
    seed: int
    version: int  # the policy version the group started under
    tasks: set[asyncio.Task] = field(default_factory=set)
    started: int = 0
    retries: int = 0


class EnvRollout:
    """Episodes in flight for open groups; finished groups go to the buffer."""

    def __init__(
        self,
        hub: InferenceHub,
        make_runner: Callable[[], EnvRunner],
        tokenizer: PreTrainedTokenizerBase,
        params: SamplingParams,
        buffer: SampleBuffer,
        group_size: int,
        redundancy: int = 0,
        max_retries: int | None = None,
        max_context_tokens: int = 2048,
        turns: TurnFormat = PlainTurns(),
        first_seed: int = 0,
    ) -> None:
        self.hub = hub
        self.make_runner = make_runner
        self.tokenizer = tokenizer
        self.params = params
        self.buffer = buffer
        self.group_size = group_size
        self.redundancy = redundancy
        self.max_retries = 2 * group_size if max_retries is None else max_retries
        self.max_context_tokens = max_context_tokens
        self.turns = turns
        self.next_seed = first_seed
        self.next_group_id = 0
        self.version = 0  # the policy version new groups start under (the worker sets it on a swap)
        self.open: dict[int, _OpenGroup] = {}
        self.counts: Counter[str] = Counter()  # episodes, lost/<kind>, cancelled, groups, ...
        self.turn_total = 0
        self.groups_done = asyncio.Event()  # set whenever a group reaches the buffer or is dropped

    def admit(self, num_groups: int) -> None:
        """Open `num_groups` new groups and start their episodes (call inside the event loop)."""
        for _ in range(num_groups):
            gid = self.next_group_id
            self.next_group_id += 1
            opened = _OpenGroup(Group(group_id=gid, prompt_id=f"seed{self.next_seed}"), self.next_seed, self.version)
            self.next_seed += 1
            self.open[gid] = opened
            for _ in range(self.group_size + self.redundancy):
                self._start(opened)

    def in_flight(self) -> int:
        return sum(len(g.tasks) for g in self.open.values())

    def cancel_stale(self, min_version: int) -> int:
        """Close the open groups started before `min_version` (they could only be dropped as
        stale once finished), cancelling their episodes; returns how many closed."""
        stale = [g for g in self.open.values() if g.version < min_version]
        for opened in stale:
            self._close(opened, keep=False, why="groups_stale")
        return len(stale)

    async def close(self) -> None:
        """Cancel every episode still running (their requests are aborted)."""
        # Out of `open` first: an episode that ends while the others are being cancelled is late,
        # not the last of a short group to be counted as dropped.
        groups = list(self.open.values())
        self.open.clear()
        tasks = [t for g in groups for t in g.tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- internals ------------------------------------------------------------
    def _start(self, opened: _OpenGroup) -> None:
        episode_id = f"g{opened.group.group_id}/e{opened.started}"
        opened.started += 1
        task = asyncio.ensure_future(self._episode(opened, episode_id))
        opened.tasks.add(task)
        task.add_done_callback(opened.tasks.discard)

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
            self.counts["cancelled"] += 1
            raise
        finally:
            await runner.close()
        self._finished(opened, episode)

    def _finished(self, opened: _OpenGroup, episode: Episode) -> None:
        group = opened.group
        # This episode is over: take it out of the live set now (its task's done callback would
        # only run later, and episodes that end in the same round must see each other gone).
        opened.tasks.discard(asyncio.current_task())
        if group.group_id not in self.open:
            return  # the group closed meanwhile (a late straggler)
        self.counts["episodes"] += 1
        self.turn_total += episode.turns
        if episode.ok:
            group.samples.append(episode.sample)
        else:
            assert episode.failure is not None
            self.counts[f"lost/{episode.failure.kind}"] += 1
            if opened.retries < self.max_retries:
                opened.retries += 1
                self.counts["retried"] += 1
                self._start(opened)
        if len(group.samples) == self.group_size:
            self._close(opened, keep=True)
        elif not opened.tasks:
            # Short and nothing left running: its retries are spent, whichever of its episodes
            # ended last (a lost one, or one that finished after a lost one found no retry left).
            self._close(opened, keep=False)

    def _close(self, opened: _OpenGroup, keep: bool, why: str = "groups_dropped") -> None:
        del self.open[opened.group.group_id]
        for task in list(opened.tasks):
            if task is not asyncio.current_task():
                task.cancel()  # stragglers: run_episode aborts their requests
        if keep:
            self.buffer.put(opened.group)
            self.counts["groups"] += 1
        else:
            self.counts[why] += 1
        self.groups_done.set()
