"""What the training loop asks of a trainer, whether it is one process or many.

`PolicyTrainer` (this process) and `TrainerGroup` (data-parallel ranks,
`runtime.trainer_workers > 1`) both satisfy `Trainer`, so the recipe never
asks which one it has.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import PreTrainedModel

from cadence.rollout.sample import Group


class Trainer(Protocol):
    version: int  # weights the policy has had: the tag of the next weight push
    model: PreTrainedModel  # the policy to export as Hugging Face weights (this process's copy)

    def step(self, groups: list[Group]) -> dict[str, float]:
        """Train on one rollout batch; the step's metrics."""
        ...

    def weights(self) -> dict[str, torch.Tensor]:
        """The policy's full weights, on CPU, for the inference engines."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything besides the weights that training continues from (optimizer, schedule, KL)."""
        ...

    def load_state_dict(self, state: dict[str, Any], folder: Path | None = None) -> None:
        """`state` from `state_dict`; `folder`: the checkpoint, read for what `save` wrote there."""
        ...

    def save(self, folder: Path) -> None:
        """Into the checkpoint `folder` (before it is complete), what `state_dict` leaves out:
        data parallel, each rank's shard of weights and optimizer state; one process, nothing."""
        ...

    def close(self) -> None:
        """Release what the trainer holds outside this process."""
        ...
