"""Temperatures between 0 and 0.01 overflow the logits (1e-40 made `multinomial` raise inside the
engine): refused where they enter, in SamplingParams and in the config (issue 33, finding 8)."""

from __future__ import annotations

import math

import pydantic
import pytest

from cadence.config import EvalConfig
from cadence.inference.types import SamplingParams
from cadence.rollout.config import RolloutConfig


@pytest.mark.parametrize("temperature", [1e-40, 0.009, -1.0, math.inf, math.nan])
def test_a_temperature_that_would_overflow_is_refused(temperature):
    with pytest.raises(ValueError, match="temperature must be 0 .greedy. or a finite number >= 0.01"):
        SamplingParams(temperature=temperature)
    with pytest.raises(pydantic.ValidationError, match="temperature"):
        RolloutConfig(temperature=temperature)
    with pytest.raises(pydantic.ValidationError, match="temperature"):
        EvalConfig(temperature=temperature)


@pytest.mark.parametrize("temperature", [0.0, 0.01, 1.0, 2.0])
def test_greedy_and_ordinary_temperatures_pass(temperature):
    assert SamplingParams(temperature=temperature).temperature == temperature
    assert RolloutConfig(temperature=temperature).temperature == temperature
