"""EmbeddedEngine: parity with transformers, log-probs, continuous batching, control."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cadence.inference import kv_cache
from cadence.inference.build import build_engine
from cadence.inference.config import EngineConfig
from cadence.inference.embedded import EmbeddedEngine
from cadence.inference.sampling import sample, token_logprobs
from cadence.inference.types import GenRequest, InferenceEngine, SamplingParams

PROMPTS = ["hello", "the quick brown fox jumps", "a", "1+1=", "Once upon a time, in a land far"]
GREEDY = SamplingParams(max_new_tokens=20, temperature=0.0, ignore_eos=True)


def load(model_dir: str, seed: int = 0):
    """A saved tiny model with its matrices re-drawn at a larger scale.

    A freshly initialised tiny model mostly repeats one token; larger weights
    make its output depend on the context, so parity tests mean something.
    """
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    scramble(model, seed)
    return model, AutoTokenizer.from_pretrained(model_dir)


def scramble(model, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(2 * torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)


def encode(tok, text: str) -> list[int]:
    return tok(text)["input_ids"]


def reqs_for(
    tok, prompts: list[str], params: SamplingParams, prefix: str = "r"
) -> list[GenRequest]:
    return [GenRequest(f"{prefix}{i}", encode(tok, p), params) for i, p in enumerate(prompts)]


def alone(model, tok, prompt: str, params: SamplingParams = GREEDY) -> list[int]:
    """Greedy tokens for one prompt in an engine of its own."""
    return (
        EmbeddedEngine(model, tok)
        .generate([GenRequest("solo", encode(tok, prompt), params)])[0]
        .token_ids
    )


@pytest.fixture(scope="module")
def llama(tiny_llama_dir):
    return load(tiny_llama_dir)


@pytest.fixture(autouse=True)
def nan_kv_buffers(monkeypatch):
    """KV buffers start as NaN rather than whatever `torch.empty` holds.

    The cache never zeroes whole buffers; this makes any column attention reads
    before the cache wrote it poison the logits, so every test here checks that.
    """

    def poisoned(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(kv_cache, "_buffer", poisoned)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_matches_transformers_generate(arch, tiny_llama_dir, tiny_qwen2_dir):
    model, tok = load(tiny_llama_dir if arch == "llama" else tiny_qwen2_dir, seed=1)
    results = EmbeddedEngine(model, tok).generate(reqs_for(tok, PROMPTS, GREEDY))
    assert len({tuple(r.token_ids) for r in results}) == len(PROMPTS)  # outputs are not trivial
    for prompt, res in zip(PROMPTS, results, strict=True):
        ids = torch.tensor([encode(tok, prompt)])
        ref = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False
        )
        ref = ref[0, ids.shape[1] :].tolist()  # stops early only at EOS
        assert res.token_ids[: len(ref)] == ref
        assert len(res.token_ids) == 20 and res.finish_reason == "length"


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_teacher_forced_forward(llama, temperature):
    model, tok = llama
    params = [
        SamplingParams(max_new_tokens=16, temperature=temperature, ignore_eos=True),
        SamplingParams(max_new_tokens=12, temperature=temperature, top_p=0.8, ignore_eos=True),
        SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True),  # scored at T = 1
    ]
    reqs = [GenRequest(f"r{i}", encode(tok, PROMPTS[i + 1]), p) for i, p in enumerate(params)]
    results = EmbeddedEngine(model, tok, seed=3).generate(reqs)
    for req, res in zip(reqs, results, strict=True):
        ids = torch.tensor([req.prompt_ids + res.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(req.prompt_ids) - 1 : -1]
        t = req.params.temperature or 1.0
        ref = torch.log_softmax(logits / t, dim=-1).gather(-1, torch.tensor(res.token_ids)[:, None])
        assert torch.allclose(torch.tensor(res.logprobs), ref.squeeze(-1), atol=1e-4)


def test_requests_joining_and_leaving_mid_flight_match_solo_runs(llama):
    model, tok = llama
    engine = EmbeddedEngine(model, tok, max_batch_size=3)
    short = SamplingParams(max_new_tokens=5, temperature=0.0, ignore_eos=True)
    plan = {  # step index -> requests added before it
        0: [("a", PROMPTS[1], GREEDY), ("early", PROMPTS[3], short)],
        3: [("long", PROMPTS[4], GREEDY)],  # longer prompt than the running cache
        6: [("tiny", PROMPTS[2], GREEDY), ("queued", PROMPTS[0], GREEDY)],  # one waits: batch of 3
    }
    results, step = {}, 0
    while step <= max(plan) or engine.has_unfinished():
        for rid, prompt, params in plan.get(step, []):
            engine.add_request(GenRequest(rid, encode(tok, prompt), params))
        results.update({r.request_id: r for r in engine.step()})
        assert engine.stats()["running"] <= 3
        step += 1
    for rid, prompt, params in (x for added in plan.values() for x in added):
        assert results[rid].token_ids == alone(model, tok, prompt, params), rid
    assert engine.stats()["cache_len"] == 0 and engine.load() == 0


def test_cache_is_trimmed_when_long_requests_leave(llama):
    model, tok = llama
    engine = EmbeddedEngine(model, tok)
    engine.add_request(GenRequest("long", encode(tok, PROMPTS[4] * 3), SamplingParams(2, 0.0)))
    engine.add_request(GenRequest("short", encode(tok, "hi"), GREEDY))
    engine.step()
    engine.step()  # "long" finishes here
    assert engine.stats()["running"] == 1
    assert engine.stats()["cache_len"] == len(encode(tok, "hi")) + 1


def test_a_freed_slot_goes_to_the_next_request(llama):
    model, tok = llama
    engine = EmbeddedEngine(model, tok, max_batch_size=3)
    short = SamplingParams(max_new_tokens=2, temperature=0.0, ignore_eos=True)
    plan = [("a", PROMPTS[1], GREEDY), ("b", PROMPTS[3], short), ("c", PROMPTS[4], GREEDY)]
    for rid, prompt, params in plan:
        engine.add_request(GenRequest(rid, encode(tok, prompt), params))
    results = {r.request_id: r for _ in range(2) for r in engine.step()}
    assert list(results) == ["b"] and engine.stats()["running"] == 2
    engine.add_request(GenRequest("d", encode(tok, PROMPTS[0]), GREEDY))
    plan.append(("d", PROMPTS[0], GREEDY))
    results.update({r.request_id: r for r in engine.step()})
    # "d" sits in the slot "b" left (no cache rows copied) but is sampled after the others.
    assert [(s.req.request_id, s.slot) for s in engine._running] == [("a", 0), ("c", 2), ("d", 1)]
    assert engine._batch.cache.rows == 3
    while engine.has_unfinished():
        results.update({r.request_id: r for r in engine.step()})
    for rid, prompt, params in plan:
        assert results[rid].token_ids == alone(model, tok, prompt, params), rid


def test_long_request_survives_many_admissions_and_finishes(llama):
    """One greedy request decodes through ~40 others joining and leaving; all match solo runs."""
    model, tok = llama
    engine = EmbeddedEngine(model, tok, max_batch_size=4)
    rng = random.Random(0)
    long = ("long", PROMPTS[0], SamplingParams(120, temperature=0.0, ignore_eos=True))
    plan = [long]
    for i in range(40):  # prompts of 1-30 characters, one longer than the window at the time
        n = 150 if i == 20 else rng.randint(1, 30)
        text = "".join(rng.choice("abcdefgh 0123456789+=") for _ in range(n))
        plan.append((f"s{i}", text, SamplingParams(rng.randint(1, 8), 0.0, ignore_eos=True)))
    pending = list(plan)
    results = {}
    while pending or engine.has_unfinished():
        for _ in range(rng.choice([0, 1, 1, 2])):
            if pending:
                rid, prompt, params = pending.pop(0)
                engine.add_request(GenRequest(rid, encode(tok, prompt), params))
        done = engine.step()
        results.update({r.request_id: r for r in done})
        # Slots freed in a step are refilled or closed in the next one: no holes pile up.
        assert len(engine._batch.holes) <= len(done)
        assert engine._batch.cache.rows == len(engine._running) + len(engine._batch.holes) <= 4
    for rid, prompt, params in plan:
        assert results[rid].token_ids == alone(model, tok, prompt, params), rid
    assert engine._batch.cache.relayouts >= 3 and engine.stats()["cache_len"] == 0


def test_static_batching_closes_holes_and_matches_solo_runs(llama):
    model, tok = llama
    engine = EmbeddedEngine(model, tok, max_batch_size=3, static_batching=True)
    plan = [
        (f"r{i}", PROMPTS[i], SamplingParams(n, temperature=0.0, ignore_eos=True))
        for i, n in enumerate([3, 9, 5, 2, 7])
    ]
    for rid, prompt, params in plan:
        engine.add_request(GenRequest(rid, encode(tok, prompt), params))
    results = {}
    while engine.has_unfinished():
        done = engine.step()
        results.update({r.request_id: r for r in done})
        assert len(engine._batch.holes) <= len(done)
        if engine.stats()["waiting"] and engine.stats()["running"]:
            assert engine.stats()["running"] <= 3 and len(results) < 3  # the first wave runs alone
    for rid, prompt, params in plan:
        assert results[rid].token_ids == alone(model, tok, prompt, params), rid


def test_generate_holds_results_of_other_requests_for_step(llama):
    model, tok = llama
    engine = EmbeddedEngine(model, tok)
    engine.add_request(GenRequest("other", encode(tok, "x"), SamplingParams(2, 0.0)))
    (mine,) = engine.generate([GenRequest("mine", encode(tok, "y"), SamplingParams(6, 0.0))])
    assert mine.request_id == "mine" and len(mine.token_ids) <= 6
    (other,) = engine.step()
    assert other.request_id == "other" and not engine.has_unfinished()


def test_abort_returns_partial_result_and_frees_the_row(llama):
    model, tok = llama
    engine = EmbeddedEngine(model, tok, max_batch_size=2)
    for rid, prompt in [("keep", PROMPTS[1]), ("stop", PROMPTS[4]), ("wait", PROMPTS[0])]:
        engine.add_request(GenRequest(rid, encode(tok, prompt), GREEDY))
    for _ in range(5):
        assert engine.step() == []
    part = engine.abort("stop")
    assert part.finish_reason == "abort" and len(part.token_ids) == len(part.logprobs) == 5
    assert part.token_ids == alone(model, tok, PROMPTS[4])[:5]
    waiting = engine.abort("wait")
    assert waiting.finish_reason == "abort" and waiting.token_ids == []
    assert engine.abort("nope") is None
    assert engine.load() == 1
    (keep,) = [r for _ in range(20) for r in engine.step()]
    assert keep.token_ids == alone(model, tok, PROMPTS[1])


def test_update_weights_changes_outputs_and_version(tiny_llama_dir):
    model, tok = load(tiny_llama_dir)
    new_model, _ = load(tiny_llama_dir, seed=5)
    engine = EmbeddedEngine(model, tok)
    before = engine.generate(reqs_for(tok, PROMPTS[:2], GREEDY, "b"))
    assert [r.version for r in before] == [0, 0]

    engine.add_request(GenRequest("inflight", encode(tok, PROMPTS[2]), GREEDY))
    engine.step()
    engine.update_weights(new_model.state_dict(), version=7)
    assert engine.version == 7
    (inflight,) = [r for _ in range(20) for r in engine.step()]
    assert (inflight.version, inflight.finish_version) == (0, 7)

    after = engine.generate(reqs_for(tok, PROMPTS[:2], GREEDY, "a"))
    assert [(r.version, r.finish_version) for r in after] == [(7, 7), (7, 7)]
    assert [r.token_ids for r in after] != [r.token_ids for r in before]
    assert [r.token_ids for r in after] == [alone(new_model, tok, p) for p in PROMPTS[:2]]
    with pytest.raises(RuntimeError):
        engine.update_weights({"bogus": torch.zeros(1)}, version=8)


def test_stop_strings_eos_and_max_tokens(llama):
    model, tok = llama
    prompt = PROMPTS[1]
    full = alone(model, tok, prompt)
    # A printable ASCII byte is one token in the char tokenizer: stop on the first one after token 0.
    k = next(i for i, t in enumerate(full) if i > 0 and tok.decode([t]).isalnum())
    stop = tok.decode([full[k]])
    k = next(i for i, t in enumerate(full) if tok.decode([t]) == stop)  # its first occurrence
    params = [
        SamplingParams(max_new_tokens=20, temperature=0.0, stop=["never", stop], ignore_eos=True),
        SamplingParams(max_new_tokens=3, temperature=0.0, ignore_eos=True),
        SamplingParams(max_new_tokens=20, temperature=0.0),
    ]
    engine = EmbeddedEngine(model, tok)
    engine.eos_ids = frozenset({full[k]})  # pretend that token is EOS for the third request
    by_stop, by_len, by_eos = engine.generate(
        [GenRequest(f"r{i}", encode(tok, prompt), p) for i, p in enumerate(params)]
    )
    assert by_stop.finish_reason == "stop" and by_stop.token_ids == full[: k + 1]
    assert by_stop.text == tok.decode(full[:k]) and len(by_stop.logprobs) == k + 1
    assert by_len.finish_reason == "length" and by_len.token_ids == full[:3]
    assert by_eos.finish_reason == "stop" and by_eos.token_ids == full[: k + 1]
    assert by_eos.text == tok.decode(full[:k])


def test_seeded_sampling_is_reproducible(llama):
    model, tok = llama
    params = SamplingParams(max_new_tokens=20, temperature=1.0, top_p=0.95, ignore_eos=True)

    def run(seed: int) -> list[list[int]]:
        return [
            r.token_ids
            for r in EmbeddedEngine(model, tok, seed=seed).generate(reqs_for(tok, PROMPTS, params))
        ]

    assert run(0) == run(0)
    assert run(0) != run(1)


def test_sampling_functions():
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 2.9]])
    gen = torch.Generator().manual_seed(0)
    greedy = sample(logits, torch.zeros(2), torch.ones(2), gen)
    assert greedy.tolist() == [1, 0]
    # top_p small enough keeps only the most likely token even when sampling
    nucleus = sample(logits, torch.ones(2), torch.full((2,), 0.3), gen)
    assert nucleus.tolist() == [1, 0]
    lp = token_logprobs(logits, torch.tensor([0.0, 0.5]), torch.tensor([1, 2]))
    expected = [torch.log_softmax(logits[0], -1)[1], torch.log_softmax(logits[1] / 0.5, -1)[2]]
    assert torch.allclose(lp, torch.stack(expected))


def test_config_and_factory(llama):
    model, tok = llama
    engine = build_engine(EngineConfig(max_batch_size=4, seed=2), model, tok)
    assert isinstance(engine, EmbeddedEngine) and isinstance(engine, InferenceEngine)
    assert engine.max_batch_size == 4 and engine.keep_kv
    assert not build_engine(EngineConfig(keep_kv_between_turns=False), model, tok).keep_kv
    with pytest.raises(ValueError):
        EngineConfig(backend="embedded", unknown=1)
    with pytest.raises(ValueError):
        EngineConfig(max_batch_size=0)
