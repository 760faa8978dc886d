"""Environment-level async rollout: groups per seed, redundancy, lost episodes retried."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from cadence.envs.runner import EnvRunner
from cadence.inference.hub import InferenceHub
from cadence.inference.mock import MockEngine
from cadence.inference.types import SamplingParams
from cadence.models.loading import load_tokenizer
from cadence.rollout.episode_producer import EpisodeProducer
from cadence.rollout.worker import RolloutWorker
from tests.inference.hub_probe import busy

CALLS: dict[str, int] = {}


class TwoTurns:
    """Two turns; the return is 1 for even seeds."""

    def reset(self, seed: int):
        self.seed, self.turn = seed, 0
        return f"seed {seed}", {}

    def step(self, action: str):
        self.turn += 1
        done = self.turn == 2
        return "again", float(done and self.seed % 2 == 0), done, False, {}


class FailsEveryThirdEpisode(TwoTurns):
    def reset(self, seed: int):
        CALLS["resets"] = CALLS.get("resets", 0) + 1
        self.doomed = CALLS["resets"] % 3 == 0
        return super().reset(seed)

    def step(self, action: str):
        if self.doomed:
            raise RuntimeError("environment crashed")
        return super().step(action)


class OneNeverAnswers(TwoTurns):
    """The first episode ever made hangs forever (fail-stop); the rest answer at once."""

    made = 0

    def __init__(self):
        OneNeverAnswers.made += 1
        self.stuck = OneNeverAnswers.made == 1

    def step(self, action: str):
        if self.stuck:
            time.sleep(3600)  # in the runner's thread; only its timeout or cancellation frees the episode
        return super().step(action)


def _rollout(env_cls, group_size=3, redundancy=0, timeout=30.0):
    hub = InferenceHub([MockEngine(max_batch_size=16, median_tokens=4, length_dist="fixed", vocab_size=50,
                                   eos_id=1, virtual_clock=True)])
    rollout = EpisodeProducer(
        hub, lambda: EnvRunner(env_cls, action_tag=None, step_timeout_s=timeout), load_tokenizer("builtin"),
        SamplingParams(max_new_tokens=8), group_size=group_size, redundancy=redundancy,
    )
    return hub, rollout


async def _collect(hub, rollout, groups: int, deadline_s: float = 20.0) -> list:
    """Play `groups` groups at once; the ones that completed (dropped ones are None)."""
    stop = asyncio.Event()
    server = asyncio.create_task(hub.serve(stop))
    try:
        async with asyncio.timeout(deadline_s):
            played = await asyncio.gather(*(rollout.play(gid, gid) for gid in range(groups)))
        return [g for g in played if g is not None]
    finally:
        await rollout.stop()
        stop.set()
        await server


def test_groups_of_episodes_share_a_seed_and_reach_the_buffer():
    hub, rollout = _rollout(TwoTurns)
    groups = asyncio.run(_collect(hub, rollout, groups=4))
    assert sorted(g.group_id for g in groups) == [0, 1, 2, 3]
    for g in groups:
        assert len(g.samples) == 3 and len({s.prompt_id for s in g.samples}) == 1
        seed = int(g.prompt_id.removeprefix("seed"))
        assert all(s.reward == float(seed % 2 == 0) for s in g.samples)
        assert all(sum(s.loss_mask) < len(s.loss_mask) for s in g.samples)  # observations masked
    assert rollout.failures.played == 12 and rollout.turn_total == 24
    assert not busy(hub)


def test_a_lost_episode_is_counted_and_replaced_on_the_same_seed():
    CALLS.clear()
    hub, rollout = _rollout(FailsEveryThirdEpisode)
    groups = asyncio.run(_collect(hub, rollout, groups=3))
    assert len(groups) == 3 and all(len(g.samples) == 3 for g in groups)
    assert rollout.failures.lost_by_kind["raised"] >= 3 and rollout.failures.retried == rollout.failures.lost


def test_redundancy_closes_a_group_without_its_fail_stop_straggler():
    OneNeverAnswers.made = 0
    hub, rollout = _rollout(OneNeverAnswers, group_size=2, redundancy=1, timeout=3600)
    groups = asyncio.run(_collect(hub, rollout, groups=2))
    assert len(groups) == 2 and all(len(g.samples) == 2 for g in groups)
    assert rollout.failures.cancelled >= 1  # the hung episode was cancelled when its group closed
    assert rollout.failures.lost_by_kind["timeout"] == 0  # nobody waited for its (hour-long) timeout


def test_without_redundancy_a_fail_stop_environment_costs_its_timeout():
    OneNeverAnswers.made = 0
    hub, rollout = _rollout(OneNeverAnswers, group_size=2, redundancy=0, timeout=0.2)
    groups = asyncio.run(_collect(hub, rollout, groups=1))
    assert len(groups) == 1 and len(groups[0].samples) == 2
    assert rollout.failures.lost_by_kind["timeout"] == 1 and rollout.failures.retried == 1


class AlwaysRaises(TwoTurns):
    def step(self, action: str):
        raise RuntimeError("environment crashed")


def test_a_group_whose_last_episodes_fail_together_is_dropped():
    """Episodes of one group that fail in the same round, with no retries left, close the group
    (each must see the others gone, not wait for their tasks' done callbacks)."""
    hub, rollout = _rollout(AlwaysRaises, group_size=3)
    rollout.max_retries = 0
    asyncio.run(_collect(hub, rollout, groups=2, deadline_s=10))
    assert rollout.failures.groups_dropped == 2 and rollout.failures.lost_by_kind["raised"] == 6


class FirstEpisodeRaises(TwoTurns):
    """The first episode made raises on its first step; the rest play two slow turns."""

    made = 0

    def __init__(self):
        FirstEpisodeRaises.made += 1
        self.doomed = FirstEpisodeRaises.made == 1

    def step(self, action: str):
        if self.doomed:
            raise RuntimeError("environment crashed")
        time.sleep(0.05)  # group-mates finish well after the lost episode found no retry left
        return super().step(action)


def test_a_group_that_ran_out_of_retries_is_dropped_when_its_last_episode_finishes():
    """A lost episode with no retry left while its group-mates still run: the group can no longer
    fill, so it is dropped when the last of them finishes (it used to stay open, and the rollout
    waited on it for ever)."""
    FirstEpisodeRaises.made = 0
    hub, rollout = _rollout(FirstEpisodeRaises, group_size=3)
    rollout.max_retries = 0
    asyncio.run(_collect(hub, rollout, groups=1, deadline_s=10))
    assert rollout.failures.groups_dropped == 1 and rollout.failures.lost_by_kind["raised"] == 1
    assert rollout.failures.played == 3 and not rollout.open


class RecordsSeeds(TwoTurns):
    seeds: list[int] = []

    def reset(self, seed: int):
        RecordsSeeds.seeds.append(seed)
        return super().reset(seed)


def test_held_out_evaluation_plays_its_own_seeds_and_counts_pass_at_k():
    """eval_episodes seeds from 10**9 up (never a training seed), each played `samples` times;
    TwoTurns returns 1 on even seeds, so half the held-out seeds are solved by every sample."""
    RecordsSeeds.seeds = []
    hub = InferenceHub([MockEngine(max_batch_size=16, median_tokens=4, length_dist="fixed", vocab_size=50,
                                   eos_id=1, virtual_clock=True)])
    rollout = EpisodeProducer(hub, lambda: EnvRunner(RecordsSeeds, action_tag=None), load_tokenizer("builtin"),
                         SamplingParams(max_new_tokens=8), group_size=2, eval_episodes=4)
    result = asyncio.run(hub.serving(rollout.evaluate(samples=2)))
    assert sorted(RecordsSeeds.seeds) == sorted([10**9 + i for i in range(4)] * 2)
    assert (result.pass_at_1, result.pass_at_k, result.k, result.prompts) == (0.5, 0.5, 2, 4)
    assert result.mean_reward == 0.5


class StepsOnCue(TwoTurns):
    """Each step blocks in the runner's thread until `cue` is set (once inside, `stepping` is set)."""

    cue = threading.Event()
    stepping = threading.Event()

    def step(self, action: str):
        self.stepping.set()
        assert self.cue.wait(30)
        return super().step(action)


class AnswersAsCancelled(EpisodeProducer):
    """An EpisodeProducer whose environments answer in the very loop round their episodes are
    cancelled: the answers are queued on the loop before the cancellation, not yet run."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.runners: list[EnvRunner] = []
        self.cancelled: list[asyncio.Task] = []

    async def stop(self) -> None:
        if self.open:  # the worker's stop (close cancels again, with nothing left)
            answered = []
            for runner in self.runners:
                if runner._in_thread is not None and not runner._in_thread.done():
                    done = threading.Event()
                    runner._in_thread.add_done_callback(lambda _, done=done: done.set())  # after the loop's
                    answered.append(done)
            StepsOnCue.cue.set()
            assert answered and all(done.wait(30) for done in answered)
            self.cancelled = [t for g in self.open.values() for t in g.plays]
        await super().stop()


def test_stopping_a_worker_cancels_episodes_whose_environment_answers_at_that_moment(caplog):
    """stop() ends every episode at once, even one whose environment call returns as it is
    cancelled (it used to play on into a turn the stopped hub never served, and stop waited on it
    until the worker's guard gave up)."""
    StepsOnCue.cue.clear()
    StepsOnCue.stepping.clear()
    hub = InferenceHub([MockEngine(max_batch_size=16, median_tokens=4, length_dist="fixed", vocab_size=50,
                                   eos_id=1, virtual_clock=True)])
    rollout = AnswersAsCancelled(
        hub, lambda: EnvRunner(StepsOnCue, action_tag=None, step_timeout_s=30), load_tokenizer("builtin"),
        SamplingParams(max_new_tokens=8), group_size=2,
    )
    make_runner = rollout.make_runner
    rollout.make_runner = lambda: rollout.runners.append(make_runner()) or rollout.runners[-1]
    worker = RolloutWorker(rollout, hub, quota=1, alpha=0)
    try:
        with caplog.at_level(logging.ERROR, logger="cadence.rollout.worker"):
            worker.start()
            assert StepsOnCue.stepping.wait(30)
            worker.stop()
        assert rollout.cancelled and all(t.done() for t in rollout.cancelled)
        assert not caplog.records  # the guard on cancelling was never hit
        assert rollout.failures.cancelled == len(rollout.cancelled) and not worker._tasks
    finally:
        StepsOnCue.cue.set()
        worker.close()
        StepsOnCue.cue.clear()
