"""EmbeddedEngine: a weight update with requests in flight (interruptible generation).

Each token's log-prob must be what a trainer forward over prompt + response
computes under the weights that sampled it: the old weights before the swap,
the new ones after (their cache is recomputed at the swap).
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cadence.inference import kv_cache
from cadence.inference.embedded import EmbeddedEngine
from cadence.inference.types import GenRequest, GenResult, SamplingParams

PROMPTS = ["hello", "the quick brown fox jumps", "a", "1+1=", "Once upon a time, in a land far"]
SWAP_AFTER = 6  # engine steps before the update


def load(model_dir: str, seed: int):
    """The tiny model with larger weights, so its output depends on the context."""
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(2 * torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
    return model


@pytest.fixture(scope="module")
def models(tiny_llama_dir):
    return load(tiny_llama_dir, 0), load(tiny_llama_dir, 5), AutoTokenizer.from_pretrained(tiny_llama_dir)


@pytest.fixture(autouse=True)
def nan_kv_buffers(monkeypatch):
    """Unwritten KV columns are NaN, so reading one poisons the logits (see test_embedded)."""
    monkeypatch.setattr(
        kv_cache, "_buffer", lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype)
    )


def teacher_forced(model, res: GenResult, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T)[token] for each response token, one forward over prompt + response."""
    with torch.no_grad():
        logits = model(torch.tensor([res.prompt_ids + res.token_ids])).logits[0]
    logits = logits[len(res.prompt_ids) - 1 : -1] / (temperature or 1.0)
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(res.token_ids)[:, None])[:, 0]


def swap_mid_flight(
    old, new, tok, temperature: float, chunk_tokens: int = 1 << 15, forward_tokens: int = 64
) -> tuple[dict[str, GenResult], dict[str, int], dict]:
    """Requests join at different steps; at the swap one has finished (its slot is a hole), three
    run, two wait for a slot. Returns the results, how many tokens each request had at the swap
    and the engine's stats.
    """
    params = SamplingParams(max_new_tokens=16, temperature=temperature, ignore_eos=True)
    plan = {  # step -> (request id, prompt, params)
        0: [("r0", PROMPTS[0], params), ("r1", PROMPTS[1], params)],
        1: [("short", PROMPTS[3], SamplingParams(5, temperature, ignore_eos=True))],
        2: [("nucleus", PROMPTS[4], SamplingParams(16, temperature, top_p=0.8, ignore_eos=True))],
        4: [("greedy", PROMPTS[2], SamplingParams(12, 0.0, ignore_eos=True))],
        5: [("late", PROMPTS[1], params)],
    }
    engine = EmbeddedEngine(copy.deepcopy(old), tok, max_batch_size=4, seed=1)  # loads in place
    engine.recompute_chunk_tokens = chunk_tokens
    engine.recompute_forward_tokens = forward_tokens
    results: dict[str, GenResult] = {}
    at_swap: dict[str, int] = {}
    step = 0
    while step <= max(plan) or engine.has_unfinished():
        for rid, prompt, p in plan.get(step, []):
            engine.add_request(GenRequest(rid, tok(prompt)["input_ids"], p))
        if step == SWAP_AFTER:
            at_swap = {seq.req.request_id: len(seq.tokens) for seq in engine._running}
            at_swap |= {rid: len(res.token_ids) for rid, res in results.items()}
            engine.update_weights(new.state_dict(), version=1)
        results.update({r.request_id: r for r in engine.step()})
        step += 1
    return results, at_swap, engine.stats()


@pytest.mark.parametrize(
    ("temperature", "chunk_tokens", "forward_tokens"),
    # 40: one row per recompute forward; forward_tokens=0: a forward per length, shortest rows
    # in the last slots (not in admission order)
    [(1.0, 1 << 15, 64), (0.7, 1 << 15, 64), (0.7, 40, 64), (0.7, 1 << 15, 0)],
)
def test_tokens_after_a_swap_have_the_new_weights_log_probs(models, temperature, chunk_tokens, forward_tokens):
    old, new, tok = models
    results, at_swap, stats = swap_mid_flight(old, new, tok, temperature, chunk_tokens, forward_tokens)
    assert stats["recompute_forwards"] == {40: 3, 0: 3}.get(min(chunk_tokens, forward_tokens), 1)
    # The scenario: one finished before the swap, three straddle it, two start after it.
    assert at_swap == {"r0": 6, "r1": 6, "short": 5, "nucleus": 4}
    for rid, res in results.items():
        t = 0.0 if rid == "greedy" else temperature
        k = at_swap.get(rid, 0)
        mu = torch.tensor(res.logprobs)
        assert torch.allclose(mu[:k], teacher_forced(old, res, t)[:k], atol=1e-4), rid
        assert torch.allclose(mu[k:], teacher_forced(new, res, t)[k:], atol=1e-4), rid
        finished_before = rid == "short"
        assert (res.version, res.finish_version) == (int(rid not in at_swap), int(not finished_before))


def test_a_stale_cache_would_give_log_probs_of_no_policy(models, monkeypatch):
    """Why the recompute: without it, post-swap log-probs match neither weights' forward.

    (Also shows the test above can fail.)
    """
    old, new, tok = models
    monkeypatch.setattr(EmbeddedEngine, "_recompute_cache", lambda self: None)
    results, at_swap, _ = swap_mid_flight(old, new, tok, 1.0)
    res, k = results["r1"], at_swap["r1"]
    mu = torch.tensor(res.logprobs)
    assert (mu[k:] - teacher_forced(new, res, 1.0)[k:]).abs().max() > 1e-3
    assert (mu[k:] - teacher_forced(old, res, 1.0)[k:]).abs().max() > 1e-3


def test_the_swap_is_counted_and_an_idle_swap_recomputes_nothing(models):
    old, new, tok = models
    engine = EmbeddedEngine(copy.deepcopy(old), tok)
    engine.update_weights(new.state_dict(), version=1)
    assert engine.stats()["recomputes"] == 0
    prompt = tok(PROMPTS[1])["input_ids"]
    engine.add_request(GenRequest("a", prompt, SamplingParams(8, 0.0, ignore_eos=True)))
    engine.step()
    engine.step()
    engine.update_weights(old.state_dict(), version=2)
    stats = engine.stats()
    # The cache holds the prompt and the first response token (the second is the next input).
    assert (stats["recomputes"], stats["recomputed_tokens"]) == (1, len(prompt) + 1)

