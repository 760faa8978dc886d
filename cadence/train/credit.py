"""Attention-rhythm credit for a training batch (SPEC section 3).

`actor_attn` is an eager-attention copy of the policy whose weights follow
the trainer's after every step, like the inference engine's. Per batch it
reads the attention maps of a few middle layers over prompt + response and
turns them into one gamma per response token (cadence.algo.rhythm).
"""

from __future__ import annotations

import time

import torch
from torch import Tensor
from transformers import PreTrainedModel

from cadence.algo.rhythm import RhythmConfig, credit_metrics
from cadence.models.attention import ActorAttention
from cadence.train.batch import TrainBatch


class AttentionCredit:
    def __init__(self, policy: PreTrainedModel, cfg: RhythmConfig, pad_id: int, micro_batch: int = 16) -> None:
        self.cfg = cfg
        self.pad_id = pad_id
        self.micro_batch = micro_batch
        self.actor_attn = ActorAttention(policy, layers=cfg.layers)
        self.last_seconds = 0.0

    def sync(self, policy: PreTrainedModel, version: int) -> None:
        self.actor_attn.update_weights(policy.state_dict(), version)

    @torch.no_grad()
    def gammas(self, batch: TrainBatch) -> tuple[list[Tensor], dict[str, float]]:
        """Per-sample gamma vectors over response tokens, and credit metrics."""
        start = time.perf_counter()
        prompts, responses = [], []
        for row in range(len(batch)):
            length = int(batch.attention_mask[row].sum())
            first = int(batch.response_start[row]) + 1  # response_start is in [L-1] space
            ids = batch.input_ids[row, :length]
            prompts.append(ids[:first])
            responses.append(ids[first:])
        results = self.actor_attn.token_credit_batch(
            prompts, responses, self.cfg, micro_batch=self.micro_batch, pad_id=self.pad_id
        )
        gammas = [g for g, _ in results]
        self.last_seconds = time.perf_counter() - start
        metrics = credit_metrics(gammas)
        metrics["rhythm/attention_seconds"] = self.last_seconds
        return gammas, metrics
