"""Build the engine that an EngineConfig names.

Backends are imported inside their branch, so a run pays only for the one it uses
(vLLM above all).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence.inference.config import EngineConfig
from cadence.inference.types import InferenceEngine

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def build_engine(
    cfg: EngineConfig,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    model_path: str | None = None,
) -> InferenceEngine:
    """Construct the engine `cfg.backend` names.

    - embedded: needs `model` and `tokenizer`.
    - mock: needs neither.
    - vllm: loads from disk, so it needs a model folder: `model_path`, or the
      folder `model` was loaded from (`model.name_or_path`). When `model` is
      given its current weights are pushed to the engine after it starts, so
      it serves exactly `model` even if the weights moved on since loading.
      `tokenizer` defaults to the folder's.
    """
    if cfg.backend == "embedded":
        from cadence.inference.embedded import EmbeddedEngine

        if model is None or tokenizer is None:
            raise ValueError("the embedded engine needs a model and a tokenizer")
        return EmbeddedEngine(
            model, tokenizer, max_batch_size=cfg.max_batch_size, seed=cfg.seed, static_batching=cfg.static_batching,
            keep_kv=cfg.keep_kv_between_turns,
        )
    if cfg.backend == "mock":
        from cadence.inference.mock import MockEngine

        return MockEngine(
            max_batch_size=cfg.max_batch_size, seed=cfg.seed, static_batching=cfg.static_batching,
            **cfg.mock.model_dump(),
        )
    if cfg.backend == "vllm":
        from cadence.inference.vllm_engine import VLLMEngine

        path = model_path or (getattr(model, "name_or_path", None) if model is not None else None)
        if not path:
            raise ValueError("the vllm engine loads from disk: pass model_path (a model folder)")
        engine = VLLMEngine(
            path, tokenizer, max_batch_size=cfg.max_batch_size, seed=cfg.seed, cfg=cfg.vllm
        )
        if model is not None:
            engine.update_weights(model.state_dict(), version=engine.version)
        return engine
    raise ValueError(f"unknown engine backend {cfg.backend!r}")
