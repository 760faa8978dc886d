"""sampling_state / load_sampling_state: a restored engine samples what the original would have.

The vLLM engine's version of this check is in test_vllm.py (it needs vLLM).
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cadence.inference.embedded import EmbeddedEngine
from cadence.inference.mock import MockEngine
from cadence.inference.types import GenRequest, GenResult, SamplingParams

PROMPTS = ["hello", "the quick brown fox jumps", "a", "1+1="]
SAMPLED = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.9, ignore_eos=True)


def scrambled(model_dir: str):
    """The tiny model with larger weights, so sampled tokens vary (see test_embedded.load)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(2 * torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
    return model, AutoTokenizer.from_pretrained(model_dir)


def batch(prefix: str, prompts: list[list[int]]) -> list[GenRequest]:
    return [GenRequest(f"{prefix}{i}", p, SAMPLED) for i, p in enumerate(prompts)]


def outputs(results: list[GenResult]) -> list[tuple[list[int], list[float]]]:
    return [(r.token_ids, r.logprobs) for r in results]


def test_embedded_engine_resumes_its_sampling_bit_identically(tiny_llama_dir):
    model, tok = scrambled(tiny_llama_dir)
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    engine = EmbeddedEngine(model, tok, max_batch_size=3, seed=11)
    engine.generate(batch("a", prompts))
    state = engine.sampling_state()
    expected = outputs(engine.generate(batch("b", prompts)))
    again = outputs(engine.generate(batch("c", prompts)))
    assert again != expected  # the state moved on: the restore below is what repeats it

    fresh = EmbeddedEngine(model, tok, max_batch_size=3, seed=999)
    assert outputs(fresh.generate(batch("b", prompts))) != expected  # its own seed differs
    fresh.load_sampling_state(state)
    assert outputs(fresh.generate(batch("b", prompts))) == expected
    with pytest.raises(ValueError, match="generator"):
        fresh.load_sampling_state({})


def test_embedded_sampling_state_survives_torch_save(tiny_llama_dir, tmp_path):
    model, tok = scrambled(tiny_llama_dir)
    prompts = [tok(p)["input_ids"] for p in PROMPTS[:2]]
    engine = EmbeddedEngine(model, tok, seed=5)
    torch.save(engine.sampling_state(), tmp_path / "s.pt")
    expected = outputs(engine.generate(batch("x", prompts)))
    fresh = EmbeddedEngine(model, tok, seed=6)
    fresh.load_sampling_state(torch.load(tmp_path / "s.pt", weights_only=True))
    assert outputs(fresh.generate(batch("x", prompts))) == expected


def test_mock_engine_resumes_its_draws_bit_identically():
    def engine(seed: int) -> MockEngine:
        return MockEngine(seed=seed, median_tokens=10, max_batch_size=2)

    prompts = [[1, 2, 3]] * 4
    first = engine(0)
    first.generate(batch("a", prompts))
    state = json.loads(json.dumps(first.sampling_state()))  # plain data: JSON round-trips it
    expected = outputs(first.generate(batch("b", prompts)))
    assert outputs(first.generate(batch("c", prompts))) != expected

    fresh = engine(1)
    fresh.load_sampling_state(state)
    assert outputs(fresh.generate(batch("b", prompts))) == expected
    with pytest.raises(ValueError, match="rng"):
        fresh.load_sampling_state({"generator": 1})
