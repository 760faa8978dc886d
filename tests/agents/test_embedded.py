"""The endpoint over the embedded engine and a tiny chat model: real sampling, real chat turns."""

from __future__ import annotations

import asyncio

import openai
import pytest

from cadence.agents import AgentEndpoint
from cadence.inference.embedded import EmbeddedEngine
from cadence.inference.hub import InferenceHub
from tests.chat_models import chat_model, chat_tokenizer


class KeptResults(InferenceHub):
    """The hub, keeping every result it hands out (what the engine sampled)."""

    def __init__(self, engines) -> None:
        super().__init__(engines)
        self.results = []

    async def generate(self, req, affinity=None):
        result = await super().generate(req, affinity)
        self.results.append(result)
        return result


@pytest.mark.parametrize("style", ["qwen2", "llama3"])
def test_a_chat_with_a_real_model_trains_exactly_what_it_sampled(style):
    tok = chat_tokenizer(style)
    hub = KeptResults([EmbeddedEngine(chat_model(style, tok, eot_bias=2.5), tok, seed=0)])

    async def main():
        endpoint = AgentEndpoint(hub, tok)
        await endpoint.start()
        try:
            run = endpoint.open_run()
            client = openai.AsyncOpenAI(base_url=endpoint.run_url(run), api_key=run, max_retries=0)
            messages = [{"role": "user", "content": "hi"}]
            for turn in range(3):
                reply = await client.chat.completions.create(model="cadence", messages=messages, max_tokens=12)
                messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                             {"role": "user", "content": f"more {turn}"}]
            return endpoint.close_run(run)
        finally:
            await endpoint.stop()

    trajectory = asyncio.run(hub.serving(main()))
    samples = trajectory.samples(1.0, 0, "chat")
    assert trajectory.counts["requests"] == 3 and trajectory.counts["stitched"] >= 1
    assert trajectory.counts["stitched"] + trajectory.counts["rerender"] == 2
    # Llama's template trims the content it renders back: a reply with a trailing space re-renders
    # differently, and the rule splits the episode there instead of training on re-tokenised text.
    assert len(samples) == 1 + trajectory.counts["rerender"] and trajectory.counts["rewrite"] == 0
    model_ids = [t for s in samples for t, m in zip(s.response_ids, s.loss_mask, strict=True) if m]
    assert model_ids == [t for r in hub.results for t in r.token_ids]
    model_mu = [lp for s in samples for lp, m in zip(s.behaviour_logprobs, s.loss_mask, strict=True) if m]
    assert model_mu == [lp for r in hub.results for lp in r.logprobs]
