"""AlgorithmConfig: defaults, field descriptions, helpful errors, loss presets."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cadence.algo.config import AlgorithmConfig

# ----------------------------------------------------------------------------- config


def test_config_defaults_and_field_descriptions():
    cfg = AlgorithmConfig()
    assert (cfg.loss, cfg.advantage, cfg.aggregation) == ("grpo", "grpo", "token-mean")
    assert (cfg.eps_low, cfg.eps_high, cfg.cispo_eps_low, cfg.cispo_eps_high) == (
        0.2,
        0.2,
        0.1,
        0.1,
    )
    assert (cfg.kl.estimator, cfg.kl.mode, cfg.mismatch.mode, cfg.mismatch.cap) == (
        "k3",
        "loss",
        "token",  # "auto" resolves to the truncated pi_old/mu weight for grpo
        2.0,
    )
    for model in (AlgorithmConfig, type(cfg.kl), type(cfg.mismatch)):
        for name, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{name} has no description"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loss": "ppo2"}, "valid: ppo, grpo"),
        ({"advantage": "gea"}, "valid: grpo, rloo"),
        ({"eps_low": 1.0}, "eps_low=1.0 must be in"),
        ({"eps_high": -0.1}, "eps_high=-0.1"),
        ({"dual_clip": 1.0}, "dual_clip=1.0 must be > 1"),
        ({"decoupled_behaviour_cap": 0.5}, "decoupled_behaviour_cap"),
        ({"aggregation": "seq-mean-token-sum-norm"}, "max_response_length"),
        ({"loss": "decoupled_ppo", "mismatch": {"mode": "token"}}, "second time"),
        ({"loss": "tis", "mismatch": {"mode": "sequence"}}, "second time"),
        ({"kl": {"coef": 0.1, "mode": "reward"}}, "kl.mode='reward'"),
        ({"kl": {"coef": -1.0}}, "kl.coef"),
        ({"mismatch": {"low": 2.0, "high": 1.0}}, "low < high"),
        ({"gamma": 1.5}, "gamma"),
        ({"tis_cap": 0.0}, "tis_cap"),
        ({"epsilon": 0.2}, "Extra inputs are not permitted"),
    ],
)
def test_config_rejects_bad_values_with_a_helpful_message(kwargs, message):
    with pytest.raises(ValidationError, match=message):
        AlgorithmConfig(**kwargs)


def test_loss_presets_apply_only_to_unset_fields():
    cfg = AlgorithmConfig(loss="dr_grpo", max_response_length=64)
    assert cfg.aggregation == "seq-mean-token-sum-norm" and cfg.std_normalize is False
    cfg = AlgorithmConfig(loss="dr_grpo", aggregation="token-mean", std_normalize=True)
    assert cfg.aggregation == "token-mean" and cfg.std_normalize is True
    assert AlgorithmConfig(loss="gspo").aggregation == "seq-mean-token-mean"
    assert AlgorithmConfig(loss="ppo").aggregation == "token-mean"
    # Round trip through a dict (YAML) keeps the resolved values.
    cfg = AlgorithmConfig(loss="dr_grpo", max_response_length=64)
    assert AlgorithmConfig(**cfg.model_dump()) == cfg


def test_asyppo_preset_averages_per_answer_like_the_paper():
    # E[ 1/|o| sum_t ... ]: token mean within an answer, then the mean over answers.
    assert AlgorithmConfig(name="asyppo").aggregation == "seq-mean-token-mean"
    assert AlgorithmConfig(name="asyppo", aggregation="token-mean").aggregation == "token-mean"
    assert AlgorithmConfig(name="ppo").aggregation == "token-mean"
