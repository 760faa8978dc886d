"""Engine configuration and the factory that turns it into an engine."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from cadence.inference.types import InferenceEngine


class EngineConfig(BaseModel):
    """Which inference engine runs the policy, and its batching limits."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["embedded"] = Field(
        "embedded",
        description="Engine implementation. 'embedded': in-process transformers decode loop "
        "(zero install; the test engine).",
    )
    max_batch_size: int = Field(
        64, gt=0, description="Most requests decoded together; the rest wait in the queue."
    )
    seed: int = Field(
        0, description="Seed of the engine's sampling generator, for reproducible runs."
    )


def build_engine(
    cfg: EngineConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> InferenceEngine:
    """Construct the engine `cfg.backend` names over `model` and `tokenizer`."""
    if cfg.backend == "embedded":
        from cadence.inference.embedded import EmbeddedEngine

        return EmbeddedEngine(model, tokenizer, max_batch_size=cfg.max_batch_size, seed=cfg.seed)
    raise ValueError(f"unknown engine backend {cfg.backend!r}")
