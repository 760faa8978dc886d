"""The simulator's inputs: model, GPU, cost-model efficiencies, workload and cluster layout.

One pydantic schema, read like every cadence config: a preset (a YAML file
in `presets/`), then an optional YAML file, then `key.sub=value` overrides.
Every number that shapes a result is a field here, so docs/scaling.md can
print the exact inputs behind each curve.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cadence.config import ConfigError, _explain, apply_override, parse_override, read_yaml
from cadence.envs.config import LatencyConfig

PRESETS = Path(__file__).resolve().parent / "presets"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSpec(_Section):
    """The policy's shape: what decode reads and what training computes."""

    name: str = Field("qwen3-8b", description="Label only.")
    params_b: float = Field(8.2, gt=0, description="Parameters, in billions.")
    layers: int = Field(36, gt=0, description="Transformer layers.")
    hidden: int = Field(4096, gt=0, description="Attention width (heads x head_dim), for attention FLOPs.")
    kv_heads: int = Field(8, gt=0, description="Key/value heads (GQA).")
    head_dim: int = Field(128, gt=0, description="Dimension of one head.")
    bytes_per_param: float = Field(2.0, gt=0, description="Weight bytes per parameter (bf16: 2).")
    kv_bytes: float = Field(2.0, gt=0, description="Bytes per KV-cache element (bf16: 2).")


class GPUSpec(_Section):
    name: str = Field("H800", description="Label only.")
    peak_tflops: float = Field(989.0, gt=0, description="Dense bf16 peak, TFLOP/s.")
    hbm_tb_s: float = Field(3.35, gt=0, description="Memory bandwidth, TB/s.")
    memory_gib: float = Field(80.0, gt=0, description="Memory per GPU, GiB.")


class RolloutSpec(_Section):
    """Memory-bound decode: each step reads the weights and every running row's KV cache."""

    tp: int = Field(1, ge=1, description="GPUs per engine replica (tensor parallel).")
    gpus_per_worker: int = Field(
        8, ge=1, description="GPUs behind one rollout worker (one node): its replicas share one hub, "
        "whose least-loaded routing spreads a group's answers over them."
    )
    bandwidth_efficiency: float = Field(0.8, gt=0, le=1, description="Achieved / peak HBM bandwidth.")
    decode_mfu: float = Field(0.5, gt=0, le=1, description="Achieved / peak FLOPs for decode matmuls.")
    prefill_mfu: float = Field(0.5, gt=0, le=1, description="Achieved / peak FLOPs for prefill.")
    step_overhead_s: float = Field(0.003, ge=0, description="Fixed cost per decode step (scheduling, sampling, launches).")
    memory_utilization: float = Field(0.9, gt=0, le=1, description="Share of GPU memory for weights + KV cache.")
    max_num_seqs: int = Field(256, ge=1, description="Most sequences one replica decodes together.")


class TrainSpec(_Section):
    """Compute-bound training: FLOPs of the batch over the training GPUs' achieved throughput."""

    mfu: float = Field(0.35, gt=0, le=1, description="Achieved / peak FLOPs of a training step.")
    extra_forwards: int = Field(
        1, ge=0, description="Forward passes besides forward+backward (old log-probs: 1; plus a reference model: 2)."
    )
    epochs: int = Field(1, ge=1, description="E: passes over each batch.")
    weight_sync_gb_s: float = Field(25.0, gt=0, description="Trainer -> engines weight broadcast, GB/s.")
    colocate_switch_s: float = Field(
        5.0, ge=0, description="Colocated (sync) runs only: seconds per step to swap training and inference "
        "states on the same GPUs (offload / reload)."
    )


class WorkloadSpec(_Section):
    prompts_per_step: int = Field(128, ge=1, description="N: prompts (groups) per training step.")
    group_size: int = Field(8, ge=1, description="Answers per prompt.")
    prompt_tokens: int = Field(512, ge=1, description="Tokens per prompt.")
    length_dist: Literal["lognormal", "fixed"] = Field("lognormal", description="Response-length distribution.")
    median_tokens: int = Field(2048, ge=1, description="Median response length.")
    sigma: float = Field(1.0, ge=0, description="Lognormal shape (the tail).")
    max_tokens: int = Field(16384, ge=1, description="Response cap (finish 'length').")


class ClusterSpec(_Section):
    gpus: int = Field(128, ge=1, description="Total GPU budget.")
    train_gpus: int | None = Field(
        None, ge=1, description="GPUs that train in an asynchronous run; the rest generate. None: the "
        "split ROLL Flash's beta* suggests (cadence/runtime/split.py) from the cost model's mu_gen, "
        "L_gen and mu_train. Ignored when colocate=true."
    )
    alpha: int = Field(2, ge=0, description="Asynchronous ratio; 0 is synchronous.")
    colocate: bool = Field(
        False, description="Generation and training take turns on all GPUs (ROLL's synchronous baseline); "
        "needs alpha=0."
    )
    replicate_prompts: bool = Field(True, description="Prompt replication: each answer is its own request.")

    @model_validator(mode="after")
    def _check(self) -> ClusterSpec:
        if self.colocate and self.alpha != 0:
            raise ValueError("colocate=true needs alpha=0: colocated generation and training take turns")
        if not self.colocate and self.train_gpus is not None and self.train_gpus >= self.gpus:
            raise ValueError(f"train_gpus={self.train_gpus} leaves no GPU of {self.gpus} to generate")
        return self


class EnvSpec(_Section):
    """Agentic episodes (`cadence simulate agentic`): turns of generation, then an environment step.

    The workload's length fields then describe one turn's response, `prompt_tokens` the first
    observation and `prompts_per_step` the groups of episodes per step (each group_size episodes
    on one environment seed)."""

    turns: int = Field(10, ge=1, description="Most turns of an episode (each a generation and an environment step).")
    min_turns: int | None = Field(
        None, ge=1, description="Fewest turns: each episode ends after a number drawn uniformly from "
        "[min_turns, turns] (an agent that succeeds early). None: every episode takes `turns`."
    )
    observation_tokens: int = Field(256, ge=1, description="Tokens the environment appends after each turn.")
    latency: LatencyConfig = Field(
        default_factory=LatencyConfig, description="Seconds each environment step takes: cadence's latency "
        "model (cadence/envs/latency.py): max(0, N(mean_s, std_s)), x fail_slow_factor for a fail-slow "
        "step, never for a fail-stop one."
    )
    step_timeout_s: float = Field(
        120.0, gt=0, description="An environment step longer than this loses its episode (a fail-stop "
        "step always does); the group retries it on a fresh environment."
    )
    mode: Literal["async", "lockstep"] = Field(
        "async", description="async: every episode its own coroutine (environment-level async); "
        "lockstep: a step's episodes advance turn by turn together (rollout.env_mode=lockstep)."
    )
    redundancy: int = Field(0, ge=0, description="Extra episodes per group; the first group_size to finish are kept.")
    extra_groups: int = Field(
        0, ge=0, description="Extra groups in flight per worker; the trainer takes the first to finish."
    )

    @model_validator(mode="after")
    def _check(self) -> EnvSpec:
        if self.min_turns is not None and self.min_turns > self.turns:
            raise ValueError(f"min_turns={self.min_turns} is above turns={self.turns}")
        return self


class RunSpec(_Section):
    steps: int = Field(6, ge=1, description="Training steps measured.")
    warmup_steps: int = Field(3, ge=0, description="Steps run first and not measured (the pipeline fills).")
    seed: int = Field(0, description="Seed of the length draws.")
    tick_tokens: int = Field(
        0, ge=0, description="Tokens per simulated decode step (the engine steps k tokens at once, paying k "
        "steps' cost): coarser is faster, finer is exact. 0: median_tokens / 32."
    )


class SimConfig(_Section):
    model: ModelSpec = Field(default_factory=ModelSpec)
    gpu: GPUSpec = Field(default_factory=GPUSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    trainer: TrainSpec = Field(default_factory=TrainSpec)
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    run: RunSpec = Field(default_factory=RunSpec)
    env: EnvSpec | None = Field(
        None, description="Agentic episodes with environment latency (`cadence simulate agentic`); "
        "None: an RLVR run."
    )

    @model_validator(mode="after")
    def _fits(self) -> SimConfig:
        if self.rollout.gpus_per_worker % self.rollout.tp:
            raise ValueError(
                f"rollout.gpus_per_worker={self.rollout.gpus_per_worker} must be a multiple of rollout.tp={self.rollout.tp}"
            )
        if self.cluster.gpus < self.rollout.tp + (0 if self.cluster.colocate else 1):
            raise ValueError(f"cluster.gpus={self.cluster.gpus} cannot hold one rollout replica and a trainer")
        return self

    def tick(self) -> int:
        """Tokens per simulated decode step."""
        return self.run.tick_tokens or max(1, self.workload.median_tokens // 32)


def presets() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


def load_sim_config(
    preset: str | None = None, path: str | os.PathLike | None = None, overrides: list[str] | None = None
) -> SimConfig:
    """A preset's values, then a YAML file's, then overrides; validated as one SimConfig."""
    tree: dict = {}
    if preset is not None:
        file = PRESETS / f"{preset}.yaml"
        if not file.exists():
            raise ConfigError(f"unknown preset {preset!r}; presets: {', '.join(presets())}")
        tree = read_yaml(file)
    if path is not None:
        _merge(tree, read_yaml(path))
    for text in overrides or []:
        apply_override(tree, *parse_override(text))
    try:
        return SimConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(_explain(err, SimConfig)) from None


def _merge(base: dict, top: dict) -> None:
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
