"""Where the trainer computes: `trainer.device` resolved, and state brought back to the host.

Everything a step builds (policy, reference, critics, actor_attn, batch tensors)
lives on one device; what leaves the trainer (weights for the engines,
checkpoint state) is copied to CPU, so the object store and safetensors see
host tensors whatever the device.
"""

from __future__ import annotations

from typing import Any

import torch


def resolve_device(name: str) -> torch.device:
    """`trainer.device` as a torch device: 'auto' is CUDA when this process sees a GPU, else CPU;
    CUDA is the current device (a data-parallel rank sets it to its own GPU first)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(name)


def to_cpu(state: Any) -> Any:
    """A copy of a (nested) state dict with every tensor detached on CPU; CPU tensors pass as
    they are (no copy), so a CPU trainer hands over exactly what it did before."""
    if isinstance(state, torch.Tensor):
        return state.detach().cpu()
    if isinstance(state, dict):
        return {k: to_cpu(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(to_cpu(v) for v in state)
    return state


def wants_cuda(name: str) -> bool:
    """Whether `trainer.device` means a GPU in this process (no CUDA context is made)."""
    return name == "cuda" or (name == "auto" and torch.cuda.is_available())


def rank_device(name: str, rank: int) -> torch.device:
    """A data-parallel rank's device: on CUDA it first makes GPU `rank` (mod the GPUs it sees) its
    current one, as NCCL wants; a Ray rank sees only the GPU it was given, so that is GPU 0."""
    if wants_cuda(name):
        torch.cuda.set_device(rank % torch.cuda.device_count())
    return resolve_device(name)
