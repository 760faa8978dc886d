"""EmbeddedEngine keeps an episode's KV cache between turns (cadence/inference/prefix_reuse.py).

The bar: an engine that reuses a turn's cache gives the same tokens and the
same log-probs (to 1e-4) as one that prefills every context from scratch, on
multi-turn episodes, across a weight swap and under slot pressure, while
running far fewer tokens through prefill forwards.
"""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from cadence.inference.embedded import EmbeddedEngine
from cadence.inference.hub import InferenceHub
from cadence.inference.types import GenRequest, GenResult, SamplingParams
from tests.inference.test_embedded import load, nan_kv_buffers  # noqa: F401 (autouse fixture)

GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)
SAMPLED = SamplingParams(max_new_tokens=6, temperature=1.0, ignore_eos=True)
NUCLEUS = SamplingParams(max_new_tokens=6, temperature=0.7, top_p=0.9, ignore_eos=True)


@pytest.fixture(scope="module")
def llama(tiny_llama_dir):
    return load(tiny_llama_dir, seed=1)


def play(
    engine: EmbeddedEngine,
    params: SamplingParams,
    episodes: int = 4,
    turns: int = 4,
    swap_after: int | None = None,
    new_weights: dict | None = None,
) -> dict[str, GenResult]:
    """Episodes whose every turn is the last context + its output + a new observation.

    A turn is queued the moment the one before it finishes, as an episode loop
    on the hub does, so the schedule depends only on the outputs. Observations
    differ in length by episode, so suffixes in one forward differ too. With
    `swap_after`, `new_weights` go in right after the step that returned that
    many results: finished turns' caches are retained then, their next turns wait.
    """
    rng = random.Random(0)
    context = {e: [rng.randrange(4, 250) for _ in range(5 + 3 * e)] for e in range(episodes)}
    turn = dict.fromkeys(range(episodes), 0)
    results: dict[str, GenResult] = {}
    for e in range(episodes):
        engine.add_request(GenRequest(f"e{e}/0", context[e], params, cache_key=f"e{e}"))
    while engine.has_unfinished():
        for res in engine.step():
            results[res.request_id] = res
            e = int(res.request_id[1 : res.request_id.index("/")])
            turn[e] += 1
            if turn[e] < turns:
                observation = [rng.randrange(4, 250) for _ in range(1 + 2 * e)]
                context[e] = context[e] + res.token_ids + observation
                engine.add_request(
                    GenRequest(f"e{e}/{turn[e]}", context[e], params, cache_key=f"e{e}")
                )
        if swap_after is not None and len(results) >= swap_after:
            engine.update_weights(new_weights, version=1)
            swap_after = None
    return results


def assert_same(with_reuse: dict[str, GenResult], without: dict[str, GenResult]) -> None:
    assert with_reuse.keys() == without.keys()
    for rid, res in with_reuse.items():
        ref = without[rid]
        assert res.prompt_ids == ref.prompt_ids and res.token_ids == ref.token_ids, rid
        assert (res.version, res.finish_version) == (ref.version, ref.finish_version)
        assert torch.allclose(torch.tensor(res.logprobs), torch.tensor(ref.logprobs), atol=1e-4)


def engines(model, tok, **kwargs) -> tuple[EmbeddedEngine, EmbeddedEngine]:
    return (
        EmbeddedEngine(model, tok, seed=3, keep_kv=True, **kwargs),
        EmbeddedEngine(model, tok, seed=3, keep_kv=False, **kwargs),
    )


@pytest.mark.parametrize("params", [GREEDY, SAMPLED, NUCLEUS], ids=["greedy", "sampled", "top_p"])
def test_turns_reuse_their_cache_and_match_an_engine_without_reuse(llama, params):
    reuse, plain = engines(*llama)
    assert_same(play(reuse, params), play(plain, params))
    stats, plain_stats = reuse.stats(), plain.stats()
    assert stats["reuse_hits"] == 4 * 3  # every turn after the first
    assert stats["prompt_tokens"] == plain_stats["prompt_tokens"] == plain_stats["prefill_tokens"]
    # Only the observations and the last sampled tokens are prefilled (plus a few recomputed
    # where turns of different episodes share a forward).
    assert stats["prefill_tokens"] < plain_stats["prefill_tokens"] / 2
    assert stats["prefill_tokens"] + stats["reused_tokens"] >= stats["prompt_tokens"]
    assert stats["retained"] == 4 and plain_stats["retained"] == 0


def test_a_weight_swap_drops_retained_caches_and_log_probs_stay_the_new_weights(llama):
    model, tok = llama
    old_weights = {k: v.clone() for k, v in model.state_dict().items()}
    new_weights = {k: v * 1.05 for k, v in old_weights.items()}
    reuse, plain = engines(model, tok)  # they share the model: each run starts from the old weights
    try:
        got = play(reuse, SAMPLED, swap_after=5, new_weights=new_weights)
        model.load_state_dict(old_weights)
        want = play(plain, SAMPLED, swap_after=5, new_weights=new_weights)
    finally:
        model.load_state_dict(old_weights)
    assert_same(got, want)
    assert reuse.stats()["retained_dropped"] > 0  # the swap came while caches were retained
    assert reuse.stats()["reuse_hits"] > 0  # and turns after it reused again
    assert {r.finish_version for r in got.values()} == {0, 1}


def test_retained_caches_are_evicted_when_running_requests_need_the_slots(llama):
    reuse, plain = engines(*llama, max_batch_size=3)
    assert_same(play(reuse, SAMPLED, episodes=5), play(plain, SAMPLED, episodes=5))
    stats = reuse.stats()
    assert stats["retained_evicted"] > 0 and stats["reuse_hits"] > 0
    assert stats["retained"] <= 3


def test_a_cache_key_is_checked_against_the_tokens(llama):
    model, tok = llama
    engine = EmbeddedEngine(model, tok, seed=3)
    first = engine.generate([GenRequest("t0", list(range(10, 40)), GREEDY, cache_key="k")])[0]
    cached = first.prompt_ids + first.token_ids[:-1]
    diverged = cached[:12] + [7, 8, 9]  # same key, a prompt that differs from token 12 on
    second = engine.generate([GenRequest("t1", diverged, GREEDY, cache_key="k")])[0]
    assert engine.stats()["reused_tokens"] == 12
    unrelated = engine.generate([GenRequest("t2", [200, 201, 202], GREEDY, cache_key="k")])[0]
    assert engine.stats()["reuse_misses"] == 2  # the first turn, and the unrelated prompt
    solo = EmbeddedEngine(model, tok, keep_kv=False)
    for res in (second, unrelated):
        ref = solo.generate([GenRequest("solo", res.prompt_ids, GREEDY)])[0]
        assert res.token_ids == ref.token_ids
        assert torch.allclose(torch.tensor(res.logprobs), torch.tensor(ref.logprobs), atol=1e-4)


def test_the_hub_keys_turns_by_affinity_and_forget_drops_the_cache(llama):
    engine = EmbeddedEngine(*llama)
    hub = InferenceHub([engine])

    async def episode() -> None:
        context = list(range(20, 50))
        for turn in range(3):
            out = await hub.generate(GenRequest(f"ep/{turn}", context, GREEDY), affinity="ep")
            context = context + out.token_ids + [5, 6]
        assert engine.stats()["retained"] == 1
        hub.forget("ep")
        await hub.pump()  # hands the forget over

    asyncio.run(hub.serving(episode()))
    stats = engine.stats()
    assert stats["reuse_hits"] == 2 and stats["retained"] == 0


def test_retained_tokens_are_counted_as_entries_come_and_go():
    # stats() reads the count from other threads while the engine changes the entries: it must
    # stay the sum over the entries through every way an entry leaves.
    from cadence.inference.prefix_reuse import CachedPrefix, RetainedContexts

    def prefix(n: int) -> CachedPrefix:
        return CachedPrefix(list(range(n)), torch.zeros(1, 1, n, 2), torch.zeros(1, 1, n, 2))

    store = RetainedContexts()
    for key, n in [("a", 5), ("b", 7), ("c", 3), ("a", 4)]:  # "a" again replaces its entry
        store.retain(key, prefix(n))
    assert store.tokens() == 4 + 7 + 3 and len(store) == 3
    req = GenRequest("r", list(range(10)), SamplingParams(), cache_key="b")
    assert store.take(req) is not None and store.tokens() == 4 + 3
    store.evict(keep=1)  # "c" was retained before "a"'s second entry, so it goes first
    assert store.tokens() == 4 and len(store) == 1
    store.forget("a")
    assert store.tokens() == 0
    store.retain("d", prefix(6))
    store.clear()
    assert store.tokens() == 0 and len(store) == 0
