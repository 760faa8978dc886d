"""InferenceHub: many concurrent callers share engine replicas' continuous batches."""

from __future__ import annotations

import asyncio
import threading

import pytest

from cadence.inference.embedded import EmbeddedEngine
from cadence.inference.hub import InferenceHub
from cadence.inference.mock import MockEngine
from cadence.inference.types import GenRequest, SamplingParams
from cadence.models.loading import load_policy, load_tokenizer
from tests.inference.hub_probe import busy, in_flight


def mock(**kw) -> MockEngine:
    return MockEngine(**{"max_batch_size": 64, "virtual_clock": True, "median_tokens": 8, **kw})


def req(i: int, max_new_tokens: int = 64, prompt=(1, 2, 3)) -> GenRequest:
    return GenRequest(f"r{i}", list(prompt), SamplingParams(max_new_tokens=max_new_tokens))


def test_concurrent_callers_share_one_continuous_batch():
    engine = mock(length_dist="fixed", median_tokens=10)
    hub = InferenceHub([engine])

    async def caller(i: int):
        await asyncio.sleep(0.001 * (i % 5))  # callers arrive at different times
        return await hub.generate(req(i))

    async def main():
        return await asyncio.gather(*(caller(i) for i in range(40)))

    results = asyncio.run(hub.serving(main()))
    assert [r.request_id for r in results] == [f"r{i}" for i in range(40)]
    assert all(len(r.token_ids) == 10 and r.finish_reason == "stop" for r in results)
    # 40 requests x 10 tokens in far fewer than 400 steps: they decoded side by side.
    assert engine.stats()["decode_steps"] < 100
    assert in_flight(hub) == [0] and not busy(hub)


def test_new_requests_go_to_the_least_loaded_replica_and_episodes_stay_put():
    a, b = mock(), mock(seed=1)
    hub = InferenceHub([a, b])

    async def main():
        futures = [hub.submit(req(i)) for i in range(6)]
        assert in_flight(hub) == [3, 3]
        turn1 = hub.submit(req(100), affinity="episode-7")
        where = in_flight(hub).index(4)
        for i in range(4):  # later turns follow the first, however loaded its replica is
            hub.submit(req(200 + i), affinity="episode-7")
        assert in_flight(hub)[where] == 8
        hub.forget("episode-7")
        hub.submit(req(300), affinity="episode-7")
        assert sorted(in_flight(hub)) == [4, 8]  # routed by load again
        while busy(hub):
            await hub.pump()
        return [f.result() for f in futures] + [turn1.result()]

    results = asyncio.run(main())
    assert all(r.finish_reason in ("stop", "length") for r in results)


def test_abort_returns_the_partial_result_to_its_caller():
    hub = InferenceHub([mock(length_dist="fixed", median_tokens=1000)])

    async def main():
        long = hub.submit(req(0, max_new_tokens=1000))
        never_started = hub.submit(req(1, max_new_tokens=1000))
        hub.abort("r1")  # still queued in the hub: answered at once, nothing generated
        for _ in range(5):
            await hub.pump()
        hub.abort("r0")
        await hub.pump()
        return await long, await never_started

    long, never_started = asyncio.run(main())
    assert long.finish_reason == "abort" and 4 <= len(long.token_ids) < 1000
    assert never_started.finish_reason == "abort" and never_started.token_ids == []
    assert len(long.logprobs) == len(long.token_ids)


def test_weights_from_another_thread_swap_between_rounds_and_are_recorded():
    engine = mock(length_dist="fixed", median_tokens=50)
    hub = InferenceHub([engine])

    async def main():
        early = hub.submit(req(0))
        for _ in range(3):
            await hub.pump()
        pusher = threading.Thread(target=hub.update_weights, args=({}, 1))
        pusher.start()
        pusher.join()
        assert engine.version == 0  # queued, not applied mid-round
        late = hub.submit(req(1))
        while busy(hub):
            await hub.pump()
        return await early, await late

    early, late = asyncio.run(main())
    assert (early.version, early.finish_version) == (0, 1)  # interrupted, kept its tokens
    assert (late.version, late.finish_version) == (1, 1)
    assert len(early.token_ids) == 50


def test_parallel_replicas_step_in_threads():
    engines = [MockEngine(max_batch_size=8, median_tokens=5, length_dist="fixed", step_latency_s=0.002)
               for _ in range(2)]
    hub = InferenceHub(engines, parallel=True)

    async def main():
        return await asyncio.gather(*(hub.generate(req(i)) for i in range(16)))

    results = asyncio.run(hub.serving(main()))
    assert len(results) == 16 and all(len(r.token_ids) == 5 for r in results)
    assert all(e.stats()["requests_finished"] == 8 for e in engines)


def test_serve_sleeps_while_idle_and_wakes_for_a_late_request():
    hub = InferenceHub([mock(length_dist="fixed", median_tokens=3)])

    async def main():
        await asyncio.sleep(0.05)  # serve() has nothing to do meanwhile
        first = await hub.generate(req(0))
        await asyncio.sleep(0.05)
        second = await hub.generate(req(1))
        return first, second

    first, second = asyncio.run(hub.serving(main()))
    assert len(first.token_ids) == len(second.token_ids) == 3


def test_what_a_result_sets_off_runs_before_the_next_engine_step():
    """A finished answer's caller goes through several loop hops (score it as a batch, join the
    group's gather, hand the group on) while other requests still decode: all of them run
    between two engine steps, so the group is handed on in the step its last answer ended."""
    engine = mock(length_dist="fixed", median_tokens=20)
    hub = InferenceHub([engine])

    async def answer() -> tuple[int, int]:
        await hub.generate(req(0, max_new_tokens=3))
        ended = engine.stats()["decode_steps"]
        loop = asyncio.get_running_loop()
        scored = loop.create_future()
        loop.call_soon(scored.set_result, 1.0)  # the scorer's batch goes out on the next loop round
        await scored
        await asyncio.gather(asyncio.sleep(0), asyncio.sleep(0))  # the group's answers
        await asyncio.sleep(0)  # the group task hands it on
        return ended, engine.stats()["decode_steps"]

    async def main():
        return await asyncio.gather(answer(), hub.generate(req(1)))

    (ended, handed_on), long = asyncio.run(hub.serving(main()))
    assert len(long.token_ids) == 20 and ended < 20  # the other request kept the engine stepping
    assert handed_on == ended


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_hub_results_equal_the_engines_own(tiny_llama_dir, temperature):
    """The hub adds routing, not behaviour: same requests, same engine seed, same tokens."""
    tok = load_tokenizer(tiny_llama_dir)
    reqs = [GenRequest(f"q{i}", tok(f"{i}+{i}=").input_ids, SamplingParams(max_new_tokens=6, temperature=temperature))
            for i in range(6)]
    direct = EmbeddedEngine(load_policy(tiny_llama_dir), tok, seed=3).generate(reqs)
    hub = InferenceHub([EmbeddedEngine(load_policy(tiny_llama_dir), tok, seed=3)])

    async def main():
        futures = [hub.submit(r) for r in reqs]  # all in one round, like generate()
        return await hub.serving(asyncio.gather(*futures))

    via_hub = asyncio.run(main())
    assert [r.token_ids for r in via_hub] == [r.token_ids for r in direct]
    for a, b in zip(via_hub, direct, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-6)


def test_a_request_id_may_not_be_in_flight_twice():
    hub = InferenceHub([mock()])

    async def main():
        hub.submit(req(0))
        with pytest.raises(ValueError, match="already in flight"):
            hub.submit(req(0))

    asyncio.run(main())
    with pytest.raises(ValueError, match="at least one"):
        InferenceHub([])
