"""Token log-probs and entropies of a causal LM, the way the engine samples.

Logits are divided by the sampling temperature before the softmax, so that
the trainer's log pi_theta and the engine's behaviour log mu describe the same
distribution (T = 1 for greedy decoding).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from transformers import PreTrainedModel

from cadence.train.batch import micro_batches


def forward_logits(model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """Logits [B, L-1, V] predicting tokens 1..L-1 (right-padded inputs)."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return out.logits[:, :-1].float()


def token_logprobs(logits: Tensor, input_ids: Tensor, temperature: float) -> Tensor:
    """log p(x_{t+1} | x_<=t) for every position: [B, L-1]."""
    scaled = logits / (temperature if temperature > 0 else 1.0)
    logp = torch.log_softmax(scaled, dim=-1)
    return logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def token_entropy(logits: Tensor, temperature: float) -> Tensor:
    """Entropy of the sampling distribution at every position: [B, L-1]."""
    scaled = logits / (temperature if temperature > 0 else 1.0)
    logp = torch.log_softmax(scaled, dim=-1)
    return -(logp.exp() * logp).sum(-1)


@torch.no_grad()
def batched_logprobs(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    temperature: float,
    micro: int,
    max_tokens: int | None = None,
    even: Callable[[list[Tensor]], tuple[list[Tensor], int]] | None = None,
) -> Tensor:
    """No-grad log-probs over a whole batch in length-sorted micro-batches (see `micro_batches`).

    Each micro-batch is cut to its longest row; padding positions come back as 0.
    `even` (FSDP ranks) pads the list of micro-batches to every rank's count with
    repeats, whose identical results are written twice.
    """
    lengths = attention_mask.sum(1)
    out = torch.zeros(input_ids.shape[0], input_ids.shape[1] - 1, device=input_ids.device)
    parts = micro_batches(lengths, micro, max_tokens)
    if even is not None:
        parts, _ = even(parts)
    for rows in parts:
        width = int(lengths[rows].max())
        logits = forward_logits(model, input_ids[rows, :width], attention_mask[rows, :width])
        out[rows, : width - 1] = token_logprobs(logits, input_ids[rows, :width], temperature)
    return out
