"""MockEngine: length distribution, continuous batching, control, virtual and real clocks."""

from __future__ import annotations

import statistics
import time

import pytest

from cadence.inference.build import build_engine
from cadence.inference.config import EngineConfig, MockEngineConfig
from cadence.inference.mock import MockEngine
from cadence.inference.types import GenRequest, InferenceEngine, SamplingParams

LONG = SamplingParams(max_new_tokens=100_000)


def req(rid: str, params: SamplingParams = LONG, prompt_len: int = 4) -> GenRequest:
    return GenRequest(rid, list(range(1, prompt_len + 1)), params)


def run_all(engine: MockEngine) -> dict:
    results = {}
    while engine.has_unfinished():
        results.update({r.request_id: r for r in engine.step()})
    return results


def test_lognormal_lengths_have_the_configured_median_and_a_long_tail():
    engine = MockEngine(seed=0, median_tokens=200, sigma=1.0, virtual_clock=True)
    lengths = sorted(engine.sample_length() for _ in range(2000))
    median = statistics.median(lengths)
    assert 180 <= median <= 220
    p99 = lengths[int(0.99 * len(lengths))]
    assert 7 < p99 / median < 14  # lognormal: exp(2.326 sigma) = 10.2
    assert lengths[-1] / median > 15  # the longest near 20x the median
    again = MockEngine(seed=0, median_tokens=200, sigma=1.0)
    assert sorted(again.sample_length() for _ in range(2000)) == lengths


def test_responses_follow_the_distribution_and_the_caps():
    engine = MockEngine(seed=1, median_tokens=30, max_tokens=100, max_batch_size=256)
    for i in range(300):
        engine.add_request(req(f"r{i}"))
    results = list(run_all(engine).values())
    capped = [r for r in results if r.finish_reason == "length"]
    assert capped and all(len(r.token_ids) == 100 for r in capped)
    stopped = [r for r in results if r.finish_reason == "stop"]
    assert all(r.token_ids[-1] == engine.eos_id for r in stopped)
    assert all(engine.eos_id not in r.token_ids[:-1] for r in results)
    assert 25 <= statistics.median(len(r.token_ids) for r in results) <= 35
    for r in results:
        assert len(r.logprobs) == len(r.token_ids) and all(lp <= 0 for lp in r.logprobs)
        assert all(0 <= t < engine.vocab_size for t in r.token_ids)

    fixed = MockEngine(length_dist="fixed", median_tokens=7)
    short, ignore = fixed.generate(
        [req("a", SamplingParams(max_new_tokens=3)), req("b", SamplingParams(10, ignore_eos=True))]
    )
    assert (len(short.token_ids), short.finish_reason) == (3, "length")
    assert (len(ignore.token_ids), ignore.finish_reason) == (10, "length")
    (exact,) = fixed.generate([req("c")])
    assert (len(exact.token_ids), exact.finish_reason) == (7, "stop")


def test_seeded_runs_are_reproducible():
    def run(seed: int):
        engine = MockEngine(seed=seed, median_tokens=20, max_batch_size=3)
        return [
            (r.token_ids, r.logprobs) for r in engine.generate([req(f"r{i}") for i in range(6)])
        ]

    assert run(0) == run(0)
    assert run(0) != run(1)


def test_continuous_batching_admits_requests_as_slots_free():
    engine = MockEngine(length_dist="fixed", median_tokens=100, max_batch_size=2)
    engine.add_request(req("short", SamplingParams(max_new_tokens=2)))
    engine.add_request(req("long", SamplingParams(max_new_tokens=5)))
    engine.add_request(req("queued", SamplingParams(max_new_tokens=3)))
    assert engine.stats()["waiting"] == 3 and engine.load() == 3

    finished_at = {}
    for step in range(1, 10):
        for r in engine.step():
            finished_at[r.request_id] = step
        assert engine.stats()["running"] <= 2
        if step == 1:
            assert (engine.stats()["running"], engine.stats()["waiting"]) == (2, 1)
    # "short" frees its row after step 2; "queued" joins at step 3 and runs 3 steps.
    assert finished_at == {"short": 2, "long": 5, "queued": 5}
    assert engine.stats()["decode_steps"] == 5 and engine.load() == 0


def test_generate_holds_results_of_other_requests_for_step():
    engine = MockEngine(length_dist="fixed", median_tokens=2)
    engine.add_request(req("other"))
    (mine,) = engine.generate([req("mine", SamplingParams(max_new_tokens=6))])
    assert mine.request_id == "mine"
    (other,) = engine.step()
    assert other.request_id == "other" and not engine.has_unfinished()


def test_abort_running_and_waiting_requests():
    engine = MockEngine(length_dist="fixed", median_tokens=50, max_batch_size=1)
    engine.add_request(req("run"))
    engine.add_request(req("wait"))
    for _ in range(4):
        assert engine.step() == []
    part = engine.abort("run")
    assert part.finish_reason == "abort" and len(part.token_ids) == len(part.logprobs) == 4
    waiting = engine.abort("wait")
    assert waiting.finish_reason == "abort" and waiting.token_ids == []
    assert engine.abort("nope") is None
    assert not engine.has_unfinished() and engine.step() == []
    with pytest.raises(ValueError):
        engine.add_request(GenRequest("empty", []))


def test_update_weights_sets_the_version():
    engine = MockEngine(length_dist="fixed", median_tokens=5)
    engine.add_request(req("inflight"))
    engine.step()
    engine.update_weights({}, version=7)
    assert engine.version == 7
    (inflight,) = run_all(engine).values()
    assert (inflight.version, inflight.finish_version) == (0, 7)
    (after,) = engine.generate([req("after")])
    assert (after.version, after.finish_version) == (7, 7)
    (tagged,) = engine.generate([GenRequest("tagged", [1], SamplingParams(), version=3)])
    assert tagged.version == 3
    assert engine.stats()["weight_updates"] == 1


def test_virtual_clock_advances_by_the_latency_model_without_sleeping():
    engine = MockEngine(
        length_dist="fixed",
        median_tokens=10,
        step_latency_s=0.5,
        per_token_latency_s=0.1,
        prefill_latency_s=0.01,
        virtual_clock=True,
    )
    start = time.perf_counter()
    engine.generate([req("a", prompt_len=4), req("b", prompt_len=6)])
    # 10 steps of 2 rows, plus the 10 prompt tokens admitted at the first step.
    assert engine.clock() == pytest.approx(10 * (0.5 + 2 * 0.1) + 10 * 0.01)
    assert engine.stats()["busy_s"] == pytest.approx(engine.clock())
    assert time.perf_counter() - start < 0.5


def test_real_clock_sleeps():
    engine = MockEngine(length_dist="fixed", median_tokens=5, step_latency_s=0.01)
    start = time.perf_counter()
    engine.generate([req("a")])
    elapsed = time.perf_counter() - start
    assert elapsed >= 0.05 and engine.clock() >= 0.05


def test_answer_fn_gives_the_text():
    engine = MockEngine(length_dist="fixed", median_tokens=3, answer_fn=lambda r: r.request_id)
    assert [r.text for r in engine.generate([req("x"), req("y")])] == ["x", "y"]
    assert MockEngine().generate([req("z", SamplingParams(max_new_tokens=2))])[0].text == ""


def test_config_builds_a_mock_engine():
    cfg = EngineConfig(
        backend="mock", max_batch_size=8, seed=3, mock=MockEngineConfig(median_tokens=12)
    )
    engine = build_engine(cfg)
    assert isinstance(engine, MockEngine) and isinstance(engine, InferenceEngine)
    assert (engine.max_batch_size, engine.median_tokens) == (8, 12)
    with pytest.raises(ValueError):
        MockEngineConfig(sigma=-1)
    with pytest.raises(ValueError):
        EngineConfig(backend="mock", mock={"unknown": 1})
    with pytest.raises(ValueError):
        build_engine(EngineConfig())  # embedded needs a model


def test_static_batching_waits_for_the_whole_wave():
    engine = MockEngine(max_batch_size=2, length_dist="fixed", median_tokens=3, virtual_clock=True, static_batching=True)
    lengths = [1, 3, 1]
    for i, n in enumerate(lengths):
        engine.add_request(GenRequest(f"r{i}", [1], SamplingParams(max_new_tokens=n)))
    finished_at = {}
    step = 0
    while engine.has_unfinished():
        step += 1
        for r in engine.step():
            finished_at[r.request_id] = step
    # r2 may only start once r0 and r1 (the first wave) are both done at step 3.
    assert finished_at == {"r0": 1, "r1": 3, "r2": 4}
