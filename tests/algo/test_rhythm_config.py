"""The attention-rhythm settings (algorithm.rhythm, algorithm.credit): defaults, bounds, one knob."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cadence.algo.rhythm import RhythmConfig
from cadence.config import ConfigError, load_config


def test_config_validation() -> None:
    cfg = RhythmConfig()
    assert (cfg.window, cfg.fai_min, cfg.fai_max) == (10, 10, 100)
    assert (cfg.head_fraction, cfg.gamma_amp, cfg.top_q, cfg.both_signs) == (0.3, 1.5, 0.4, True)
    assert (cfg.alpha, cfg.lookback, cfg.layers, cfg.micro_batch) == (0.5, 3, 5, 128)
    assert cfg.tau_waad == cfg.tau_delta == "median"
    assert RhythmConfig(tau_waad=2.0).tau_waad == 2.0
    for bad in [
        {"typo": 1},
        {"fai_min": 50, "fai_max": 20},
        {"head_fraction": 0.6},
        {"tau_delta": "mean"},
        {"micro_batch": 0},
    ]:
        with pytest.raises(ValidationError):
            RhythmConfig(**bad)


def test_credit_is_one_knob() -> None:
    """The mode is algorithm.credit only; the old algorithm.rhythm.credit points there."""
    with pytest.raises(ValidationError, match="algorithm.credit=local"):
        RhythmConfig(credit="local")
    with pytest.raises(ConfigError) as err:
        load_config(None, ["algorithm.rhythm.credit=coupled", "algorithm.rhythm.top_q=0.3"])
    assert "set algorithm.credit=coupled instead" in str(err.value)
    cfg = load_config(None, ["algorithm.credit=local", "algorithm.rhythm.top_q=0.3"])
    assert cfg.algorithm.credit == "local" and cfg.algorithm.rhythm.top_q == 0.3
    assert load_config(None, []).algorithm.credit == "none"
