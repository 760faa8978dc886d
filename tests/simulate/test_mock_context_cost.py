"""The mock engine's KV-read term: each decode step pays for every running row's context."""

from __future__ import annotations

import pytest

from cadence.inference.mock import MockEngine
from cadence.inference.types import GenRequest, SamplingParams


def test_context_latency_charges_prompt_plus_generated_tokens_of_running_rows():
    engine = MockEngine(length_dist="fixed", median_tokens=3, max_batch_size=4, virtual_clock=True,
                        step_latency_s=1.0, context_latency_s=0.5)
    params = SamplingParams(max_new_tokens=100)
    engine.add_request(GenRequest("a", [1, 2], params))  # 2 prompt tokens
    engine.add_request(GenRequest("b", [1, 2, 3, 4], params))  # 4 prompt tokens
    engine.step()  # contexts 2 + 4 before this step's token: 1 + 0.5 * 6
    assert engine.clock() == pytest.approx(4.0)
    engine.step()  # contexts 3 + 5: 1 + 0.5 * 8
    assert engine.clock() == pytest.approx(9.0)
    engine.step()  # contexts 4 + 6, both finish at their third token
    assert engine.clock() == pytest.approx(15.0)
    assert not engine.has_unfinished()


def test_context_latency_defaults_to_nothing_and_rejects_negatives():
    engine = MockEngine(length_dist="fixed", median_tokens=2, virtual_clock=True, step_latency_s=1.0)
    engine.add_request(GenRequest("a", list(range(100)), SamplingParams(max_new_tokens=10)))
    engine.step()
    assert engine.clock() == pytest.approx(1.0)
    with pytest.raises(ValueError):
        MockEngine(context_latency_s=-1.0)
