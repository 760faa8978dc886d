"""The hub contains an engine's exception (issue 33, #7): the requests it held fail with
`EngineFailed`, the error is logged, and the hub keeps serving; before, the exception ended
`InferenceHub.serve` and every caller, then and later, waited for ever. And the embedded engine
refuses a token id outside its vocabulary when the request arrives, not mid-batch."""

from __future__ import annotations

import asyncio
import logging

import pytest

from cadence.inference.embedded import EmbeddedEngine
from cadence.inference.hub import EngineFailed, InferenceHub
from cadence.inference.mock import MockEngine
from cadence.inference.types import GenRequest, SamplingParams
from cadence.models.loading import load_policy, load_tokenizer
from tests.inference.hub_probe import in_flight

POISON = 999_999  # a prompt holding this id breaks the engine below


class Brittle(MockEngine):
    """A mock engine whose step raises, as an embedding lookup does on an unknown id; and whose
    add_request refuses an empty-looking prompt."""

    def add_request(self, req: GenRequest) -> None:
        if req.prompt_ids == [0]:
            raise ValueError("a prompt of padding")
        super().add_request(req)

    def step(self):
        if any(POISON in s.req.prompt_ids for s in list(self._waiting) + self._running):
            raise IndexError("index out of range in self")
        return super().step()


def req(name: str, prompt: list[int]) -> GenRequest:
    return GenRequest(name, prompt, SamplingParams(max_new_tokens=4))


@pytest.mark.parametrize("parallel", [False, True])
def test_a_step_that_raises_fails_its_requests_and_the_hub_serves_on(parallel, caplog):
    engines = [Brittle(max_batch_size=8, virtual_clock=True, median_tokens=3) for _ in range(2 if parallel else 1)]
    hub = InferenceHub(engines, parallel=parallel)

    async def main():
        poisoned = await asyncio.gather(hub.generate(req("bad", [1, POISON])), hub.generate(req("other", [1, 2])),
                                        return_exceptions=True)
        refused = await asyncio.gather(hub.generate(req("pad", [0])), return_exceptions=True)
        later = await hub.generate(req("later", [1, 2, 3]))
        return poisoned, refused, later

    async def within_a_minute():  # a hub that died leaves its callers waiting: fail, do not hang
        return await asyncio.wait_for(main(), timeout=60)

    with caplog.at_level(logging.WARNING, logger="cadence.inference.hub"):
        poisoned, refused, later = asyncio.run(hub.serving(within_a_minute()))
    assert isinstance(poisoned[0], EngineFailed) and "IndexError: index out of range" in str(poisoned[0])
    # `other` shared the failed step's replica (or had its own and finished): never left waiting.
    assert isinstance(poisoned[1], EngineFailed) or poisoned[1].finish_reason in ("stop", "length")
    assert isinstance(refused[0], EngineFailed) and "a prompt of padding" in str(refused[0])
    assert later.finish_reason in ("stop", "length") and later.token_ids
    assert in_flight(hub) == [0] * len(engines)
    assert "failed a step" in caplog.text and "refused request pad" in caplog.text


def test_the_embedded_engine_refuses_an_id_outside_its_vocabulary():
    engine = EmbeddedEngine(load_policy("builtin").eval(), load_tokenizer("builtin"))
    vocab = engine.vocab_size
    for bad in (vocab, -1):
        with pytest.raises(ValueError, match=f"token id {bad} is not in the model's vocabulary"):
            engine.add_request(req("r", [1, bad]))
    assert not engine.has_unfinished()
