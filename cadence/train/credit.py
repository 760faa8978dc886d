"""Attention-rhythm credit for a training batch (SPEC section 3).

`actor_attn` is an eager-attention copy of the policy whose weights follow
the trainer's after every step, like the inference engine's. Per batch it
reads the attention maps of a few middle layers over prompt + response and
turns them into one gamma per response token (cadence.algo.rhythm), with one
forward and one batched credit computation per `RhythmConfig.micro_batch`
samples.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch
from torch import Tensor
from transformers import PreTrainedModel

from cadence.algo.rhythm import CreditMode, RhythmConfig
from cadence.algo.rhythm_shaping import credit_metrics
from cadence.models.attention import ActorAttention
from cadence.train.batch import TrainBatch


class Credit(Protocol):
    """What the trainer asks of credit, local or hosted (`cadence.runtime.hosted.RemoteCredit`)."""

    def update_weights(self, state_dict: dict[str, Tensor], version: int) -> None: ...

    def gammas(self, batch: TrainBatch) -> tuple[Tensor, dict[str, float]]: ...


class AttentionCredit:
    """Gammas for the trainer from `actor_attn`.

    `credit` is `algorithm.credit` (the rule), `cfg` is `algorithm.rhythm` (its
    constants); `micro_batch` overrides `cfg.micro_batch`.
    """

    def __init__(
        self,
        policy: PreTrainedModel,
        credit: CreditMode,
        cfg: RhythmConfig,
        pad_id: int,
        micro_batch: int | None = None,
    ) -> None:
        self.credit = credit
        self.cfg = cfg
        self.pad_id = pad_id
        self.micro_batch = micro_batch or cfg.micro_batch
        self.actor_attn = ActorAttention(policy, layers=cfg.layers)
        self.last_seconds = 0.0

    def to(self, device: torch.device) -> AttentionCredit:
        """actor_attn onto the trainer's device."""
        self.actor_attn.model.to(device)
        return self

    def update_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        self.actor_attn.update_weights(state_dict, version)

    @torch.no_grad()
    def gammas(self, batch: TrainBatch) -> tuple[Tensor, dict[str, float]]:
        """Gammas [B, L-1] aligned with the batch's token tensors (1 outside responses), and
        credit metrics over the tokens that are trained on.

        The attention maps are read over the whole response, an episode's observation
        tokens included (they are context the model attended to); only the model's own
        tokens, where `batch.mask` is 1, are ranked for credit and get gammas."""
        start = time.perf_counter()
        # The batch is already right-padded prompt + response: hand it over as is.
        # response_start is in [L-1] (next-token) space; +1 is the input position.
        # mask is in [L-1] (next-token) space: mask[:, p] trains the token at position p + 1.
        trained = torch.zeros_like(batch.input_ids, dtype=torch.bool)
        trained[:, 1:] = batch.mask.bool()
        gammas, _ = self.actor_attn.token_credit_padded(
            batch.input_ids,
            batch.response_start + 1,
            batch.attention_mask.sum(1),
            self.credit,
            self.cfg,
            micro_batch=self.micro_batch,
            pad_id=self.pad_id,
            trained=trained,
        )
        self.last_seconds = time.perf_counter() - start
        full = torch.ones_like(batch.mask)
        for row, (g, first) in enumerate(zip(gammas, batch.response_start.tolist(), strict=True)):
            full[row, first : first + g.numel()] = g.to(full)  # actor_attn hands gammas back on CPU
        gammas = full
        metrics = credit_metrics(gammas, batch.mask)
        metrics["rhythm/attention_seconds"] = self.last_seconds
        return gammas, metrics

