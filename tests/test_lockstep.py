"""Lock-step rollout (rollout.env_mode=lockstep): a barrier per turn, the same episodes as async."""

from __future__ import annotations

import asyncio
import time

from cadence.envs.runner import EnvRunner
from cadence.inference.embedded import EmbeddedEngine
from cadence.inference.hub import InferenceHub
from cadence.inference.mock import MockEngine
from cadence.inference.types import SamplingParams
from cadence.models.loading import load_policy, load_tokenizer
from cadence.rollout.episode_producer import EpisodeProducer
from cadence.rollout.lockstep import LockstepEpisodeProducer, TurnBarrier

STEPS: list[tuple[int, int, float, float]] = []  # (seed, turn, started, ended) of every env step


class UnevenSteps:
    """Three turns; seed s sleeps 10 ms x (s mod 4) per step, so some episodes are always slower."""

    def reset(self, seed: int):
        self.seed, self.turn = seed, 0
        return f"start {seed}", {}

    def step(self, action: str):
        self.turn += 1
        began = time.monotonic()
        time.sleep(0.01 * (self.seed % 4))
        STEPS.append((self.seed, self.turn, began, time.monotonic()))
        done = self.turn == 3
        return f"turn {self.turn}", float(done and self.seed % 2 == 0), done, False, {}


class TimedHub(InferenceHub):
    """Records when each turn's generation was asked for: (turn index, time)."""

    def __init__(self, engines):
        super().__init__(engines)
        self.asked: list[tuple[int, float]] = []
        self.answered: list[tuple[int, float]] = []

    async def generate(self, req, affinity=None):
        turn = int(req.request_id.rsplit("/", 1)[1])
        self.asked.append((turn, time.monotonic()))
        out = await super().generate(req, affinity)
        self.answered.append((turn, time.monotonic()))
        return out


def _rollout(cls, engine, group_size=2, redundancy=0, **kwargs):
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    return cls(
        TimedHub([engine]), lambda: EnvRunner(UnevenSteps, action_tag=None, step_timeout_s=30),
        load_tokenizer("builtin"), params, group_size=group_size, redundancy=redundancy, **kwargs,
    )


async def _collect(rollout, groups: int) -> list:
    stop = asyncio.Event()
    server = asyncio.create_task(rollout.hub.serve(stop))
    try:
        async with asyncio.timeout(30):
            return list(await asyncio.gather(*(rollout.play(gid, gid) for gid in range(groups))))
    finally:
        await rollout.stop()
        stop.set()
        await server


def _mock():
    return MockEngine(max_batch_size=16, median_tokens=3, length_dist="fixed", vocab_size=50, eos_id=1,
                      virtual_clock=True)


def _turns_overlap() -> bool:
    """Did any environment step of turn k+1 start before every step of turn k had ended?"""
    last_turn = max(t for _, t, _, _ in STEPS)
    for turn in range(1, last_turn):
        ended = max(e for _, t, _, e in STEPS if t == turn)
        if min(b for _, t, b, _ in STEPS if t == turn + 1) < ended:
            return True
    return False


def test_every_turn_waits_for_the_slowest_environment_of_the_batch():
    STEPS.clear()
    rollout = _rollout(LockstepEpisodeProducer, _mock(), batch_groups=4)
    groups = asyncio.run(_collect(rollout, groups=4))
    assert len(groups) == 4 and all(len(g.samples) == 2 for g in groups)
    assert len(STEPS) == 4 * 2 * 3 and not _turns_overlap()
    assert rollout.batches == 1
    for turn in (1, 2):  # turn k+1 is generated for everyone once every step of turn k is done
        last_step = max(e for _, t, _, e in STEPS if t == turn)
        assert min(at for t, at in rollout.hub.asked if t == turn) >= last_step
    for turn in (1, 2, 3):  # and no environment steps before the whole turn is generated
        last_answer = max(at for t, at in rollout.hub.answered if t == turn - 1)
        assert min(b for _, t, b, _ in STEPS if t == turn) >= last_answer


def test_async_mode_has_no_such_barrier():
    """The contrast that shows the lock-step test can fail: fast episodes run ahead."""
    STEPS.clear()
    rollout = _rollout(EpisodeProducer, _mock())
    asyncio.run(_collect(rollout, groups=4))
    assert _turns_overlap()


def test_batches_of_groups_run_one_after_another():
    STEPS.clear()
    rollout = _rollout(LockstepEpisodeProducer, _mock(), batch_groups=2)
    groups = asyncio.run(_collect(rollout, groups=4))
    assert len(groups) == 4 and rollout.batches == 2
    first = {int(g.prompt_id.removeprefix("seed")) for g in groups if g.group_id < 2}
    first_done = max(e for s, _, _, e in STEPS if s in first)
    assert all(b >= first_done for s, _, b, _ in STEPS if s not in first)


def test_redundant_stragglers_leave_the_barrier():
    STEPS.clear()
    rollout = _rollout(LockstepEpisodeProducer, _mock(), group_size=2, redundancy=1, batch_groups=3)
    groups = asyncio.run(_collect(rollout, groups=3))
    assert len(groups) == 3 and all(len(g.samples) == 2 for g in groups)


def _greedy_episodes(cls, kwargs):
    engine = EmbeddedEngine(load_policy("builtin").eval(), load_tokenizer("builtin"), max_batch_size=16, seed=0)
    rollout = _rollout(cls, engine, **kwargs)
    groups = asyncio.run(_collect(rollout, groups=3))
    return sorted(
        (s.prompt_id, s.prompt_ids, s.response_ids, s.loss_mask, s.reward) for g in groups for s in g.samples
    )


def test_lockstep_and_async_play_the_same_episodes_under_greedy_decoding():
    lockstep = _greedy_episodes(LockstepEpisodeProducer, {"batch_groups": 3})
    assert lockstep == _greedy_episodes(EpisodeProducer, {})
    assert {p for p, *_ in lockstep} == {"seed0", "seed1", "seed2"}


def test_a_party_leaving_releases_the_others():
    async def scenario() -> list[str]:
        barrier, order = TurnBarrier(), []
        for _ in range(3):
            barrier.join()

        async def waits(name: str) -> None:
            await barrier.wait()
            order.append(name)

        waiting = [asyncio.ensure_future(waits(n)) for n in ("a", "b")]
        await asyncio.sleep(0.01)
        assert order == []  # two of three parties are waiting
        barrier.leave()  # the third episode ended
        await asyncio.gather(*waiting)
        return order

    assert sorted(asyncio.run(scenario())) == ["a", "b"]


def test_cancel_stale_closes_groups_started_under_an_older_policy():
    async def scenario():
        rollout = _rollout(EpisodeProducer, _mock())
        stop = asyncio.Event()
        server = asyncio.create_task(rollout.hub.serve(stop))
        plays = [asyncio.ensure_future(rollout.play(gid, gid)) for gid in (0, 1)]
        await asyncio.sleep(0)
        rollout.version = 1
        plays.append(asyncio.ensure_future(rollout.play(2, 2)))
        await asyncio.sleep(0)
        stale_tasks = [t for gid in (0, 1) for t in rollout.open[gid].plays]
        closed = rollout.cancel_stale(1)
        await asyncio.gather(*stale_tasks, return_exceptions=True)
        # Their episodes ended (cancelled, or ended by the cancellation at an environment call).
        open_now = (sorted(rollout.open), all(t.done() for t in stale_tasks), len(stale_tasks))
        assert await plays[0] is None and await plays[1] is None  # their groups will never train
        await rollout.stop()
        stop.set()
        await server
        return closed, open_now, rollout.stale_cancelled, rollout.failures.groups_dropped

    closed, open_now, stale, dropped = asyncio.run(scenario())
    assert closed == 2 and open_now == ([2], True, 4) and stale == 2
    assert dropped == 0  # stale is not "out of retries"


def test_the_worker_runs_lockstep_with_extra_groups_from_config():
    from cadence.assemble import ConfiguredRolloutWorker
    from cadence.config import load_config

    cfg = load_config(None, [
        "env.name=python:tests/agentic_envs.py:Parity", "env.action_tag=null", "env.max_turns=2",
        "rollout.env_mode=lockstep", "rollout.extra_groups=2", "rollout.prompts_per_step=2",
        "rollout.group_size=2", "rollout.max_new_tokens=3", "rollout.engine.backend=mock",
        "rollout.engine.mock.vocab_size=256", "rollout.engine.mock.median_tokens=3",
    ])
    worker = ConfiguredRolloutWorker(cfg)
    try:
        assert isinstance(worker.producer, LockstepEpisodeProducer) and worker.producer.batch_groups == 2
        assert worker._room() == 2 + 2  # (swaps + alpha + 1) x quota + extra_groups
        batch = worker.get_batch(0, timeout=60)
        assert len(batch) == 2 and all(len(g.samples) == 2 for g in batch)
    finally:
        worker.close()


def test_cancel_stale_closes_a_lockstep_batch_too():
    """The worker calls cancel_stale at each weight swap when rollout.extra_groups > 0, in
    either env_mode: lock-step closes the stale groups and counts them as stale."""

    async def scenario():
        rollout = _rollout(LockstepEpisodeProducer, _mock(), batch_groups=2)
        stop = asyncio.Event()
        server = asyncio.create_task(rollout.hub.serve(stop))
        try:
            for gid in (0, 1):
                asyncio.ensure_future(rollout.play(gid, gid))
            await asyncio.sleep(0.01)  # the driver opens the batch
            rollout.version = 1
            return rollout.cancel_stale(1), rollout.stale_cancelled, rollout.failures.groups_dropped
        finally:
            await rollout.stop()
            stop.set()
            await server

    closed, stale, dropped = asyncio.run(scenario())
    assert closed == 2 and stale == 2 and dropped == 0
