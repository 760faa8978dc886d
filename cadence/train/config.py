"""`TrainerConfig` and `CheckpointConfig`: the optimizer, its batches and how often a run is saved."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class TrainerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    steps: int = Field(200, gt=0, description="Training steps (one rollout batch each).")
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    grad_clip: float = Field(1.0, gt=0, description="Max global gradient norm.")
    micro_batch_size: int = Field(64, gt=0, description="Most sequences per forward/backward.")
    micro_batch_tokens: int | None = Field(
        2048,
        gt=0,
        description="Token budget per forward/backward (rows x longest row); rows are grouped by "
        "length so long-tailed batches pad little. Raise it on a GPU; null: micro_batch_size rows each.",
    )
    mini_batches: int = Field(1, gt=0, description="Optimizer steps per rollout batch (PPO-style).")
    epochs: int = Field(1, gt=0, description="Passes over each rollout batch.")
    grad_norm_by_staleness: Literal["auto", "on", "off"] = Field(
        "auto", description="Log offpolicy/grad_norm_stale_<bucket>, the norm of the gradient that the samples "
        "0, 1, 2-3, 4-7 or 8+ versions behind contribute (their micro-batches run bucket by bucket; the total "
        "gradient is unchanged; a long-tailed batch pays more padding). 'auto': every "
        "grad_norm_by_staleness_every-th step whose batch holds a stale sample (rollout.async_ratio > 0), "
        "off under data parallelism and with algorithm.mismatch.mode=m2po, whose mask is per micro-batch; "
        "'on': every step."
    )
    grad_norm_by_staleness_every: int = Field(
        10, gt=0, description="grad_norm_by_staleness=auto measures training steps 10, 20, ... (for 10): "
        "splitting by bucket cost up to 1.2x a step's training time on long-tailed batches, so auto samples it."
    )
    warmup_steps: int = Field(0, ge=0, description="Linear LR warm-up steps.")
    schedule: Literal["constant", "cosine", "linear"] = Field("constant", description="LR decay after warm-up.")
    recompute_old_logprobs: Literal["auto", "always"] = Field(
        "auto", description="Recompute pi_old with a no-grad pass; 'auto' only when a batch gets "
        "several updates (epochs or mini_batches > 1): with one update pi_old is the updating policy "
        "itself, stale samples included (their behaviour log-probs come from the engine)."
    )
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp", description="With runtime.trainer_workers > 1: 'ddp' keeps a whole policy on every rank and "
        "all-reduces gradients; 'fsdp' shards weights, gradients and optimizer state over the ranks "
        "(FSDP2 fully_shard per decoder layer, then the whole model)."
    )
    cpu_offload: bool = Field(
        False, description="trainer.strategy=fsdp: keep the sharded weights and optimizer state in CPU memory "
        "between uses (saves accelerator memory; no effect on a CPU-only run)."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where the trainer computes (policy, reference, critics, actor_attn, batches): "
        "'auto' is cuda when this machine has a GPU, else cpu. Data-parallel ranks on cuda use NCCL "
        "(one GPU each), on cpu gloo. Weights leave the trainer on CPU either way."
    )
    gradient_checkpointing: bool = Field(
        False, description="Activation checkpointing for the policy and the critics: each decoder layer's "
        "activations are recomputed in the backward pass instead of kept from the forward (less memory, "
        "about one more forward of time; the same loss and gradients)."
    )
    bf16_autocast: bool = Field(
        False, description="Run the policy's and the reference's forward passes under bfloat16 autocast "
        "(torch.autocast on trainer.device; meant for cuda). Weights, gradients, optimizer state and the "
        "log-prob and loss math stay float32."
    )

    @field_validator("grad_norm_by_staleness", mode="before")
    @classmethod
    def _on_off(cls, value: object) -> object:
        """`trainer.grad_norm_by_staleness=on` on the command line is YAML's boolean true."""
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @field_validator("device")
    @classmethod
    def _cuda_is_there(cls, device: str) -> str:
        if device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ValueError("torch sees no CUDA GPU on this machine; set trainer.device=cpu or auto")
        return device


class CheckpointConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    every: int = Field(50, ge=0, description="Save every N steps (0 = only at the end).")
    keep: int = Field(2, gt=0, description="Checkpoints kept on disk (oldest removed first).")
