"""Turn sample groups into padded tensors aligned for next-token log-probs.

Position t of every [B, L-1] tensor describes the token at input position
t+1, the one predicted by logits[:, t]. `mask` is 1 where that token is part
of a response and was written by the model (an episode's observation tokens
sit inside its response with mask 0).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

from cadence.rollout.sample import Group, Sample


@dataclass
class TrainBatch:
    input_ids: Tensor  # [B, L] prompt + response, right-padded
    attention_mask: Tensor  # [B, L]
    mask: Tensor  # [B, L-1] float, 1 on response tokens
    behaviour_logprobs: Tensor  # [B, L-1]
    rewards: Tensor  # [B]
    group_ids: Tensor  # [B]
    versions: Tensor  # [B] policy version that started each sample
    response_start: Tensor  # [B] index in [L-1] space of the first response token
    # [B, L-1] rewards on tokens: each turn's reward on its last model token (an episode), or the
    # sample's reward on its last response token (a single answer); what gae and turn_grpo read.
    token_rewards: Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: Tensor | slice) -> TrainBatch:
        return TrainBatch(**{f.name: getattr(self, f.name)[rows] for f in fields(self)})

    def to(self, device: torch.device | str) -> TrainBatch:
        return TrainBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def trimmed(self) -> TrainBatch:
        """The same rows without trailing columns that are padding in every row."""
        width = int(self.attention_mask.sum(1).max())
        return replace(
            self,
            input_ids=self.input_ids[:, :width],
            attention_mask=self.attention_mask[:, :width],
            mask=self.mask[:, : width - 1],
            behaviour_logprobs=self.behaviour_logprobs[:, : width - 1],
            token_rewards=self.token_rewards[:, : width - 1],
        )


def micro_batches(lengths: Tensor, max_rows: int, max_tokens: int | None = None) -> list[Tensor]:
    """Split rows into micro-batches of similar length: index tensors into `lengths`.

    Rows are taken longest first; a micro-batch closes when it holds `max_rows`
    rows or when one more row would make rows x longest exceed `max_tokens`
    (a long row still goes alone). Every micro-batch is then padded only to its
    own longest row, so a long-tailed batch pays for its long responses once.
    """
    order = lengths.argsort(descending=True, stable=True)
    parts: list[Tensor] = []
    lo = 0
    while lo < len(order):
        width = int(lengths[order[lo]])  # the longest row of this micro-batch
        rows = max_rows if max_tokens is None else max(1, min(max_rows, max_tokens // max(width, 1)))
        parts.append(order[lo : lo + rows])
        lo += rows
    return parts


# Staleness buckets (versions behind the trainer) for the gradient norm per bucket: widths double,
# as the spread of staleness does when rollout.async_ratio grows; prime-rl drops what is over 8.
STALENESS_BUCKETS = ("0", "1", "2-3", "4-7", "8+")


def staleness_bucket(staleness: int) -> int:
    """Index into STALENESS_BUCKETS: 0 -> 0, 1 -> 1, 2-3 -> 2, 4-7 -> 3, 8 or more -> 4."""
    return min(max(staleness, 0).bit_length(), len(STALENESS_BUCKETS) - 1)


def bucketed_micro_batches(
    lengths: Tensor, staleness: Tensor, max_rows: int, max_tokens: int | None = None
) -> list[tuple[str, list[Tensor]]]:
    """`micro_batches` within each staleness bucket present, freshest bucket first: (bucket name,
    its micro-batches as index tensors into `lengths`). A batch in one bucket splits as
    `micro_batches` splits it."""
    buckets = torch.tensor([staleness_bucket(s) for s in staleness.tolist()], device=lengths.device)
    out = []
    for b in buckets.unique().tolist():  # ascending: freshest first
        rows = torch.nonzero(buckets == b).flatten()
        out.append((STALENESS_BUCKETS[b], [rows[p] for p in micro_batches(lengths[rows], max_rows, max_tokens)]))
    return out


def flatten(groups: list[Group]) -> list[Sample]:
    return [s for g in groups for s in g.samples]


def collate(samples: list[Sample], pad_id: int, device: torch.device | str = "cpu") -> TrainBatch:
    """The samples as one right-padded batch on `device`: built row by row in host memory, then
    moved in one copy per tensor (not one per row)."""
    host = torch.device("cpu")
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    width = max(lengths)
    n = len(samples)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long, device=host)
    attention = torch.zeros((n, width), dtype=torch.long, device=host)
    mask = torch.zeros((n, width - 1), device=host)
    behaviour = torch.zeros((n, width - 1), device=host)
    start = torch.zeros(n, dtype=torch.long, device=host)
    token_rewards = torch.zeros((n, width - 1), device=host)
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        input_ids[i, : p + r] = torch.tensor(s.prompt_ids + s.response_ids, device=host)
        attention[i, : p + r] = 1
        # Only the model's tokens are trained on; an episode's observation tokens are context.
        mask[i, p - 1 : p - 1 + r] = 1.0 if s.loss_mask is None else torch.tensor(s.loss_mask, dtype=torch.float32, device=host)
        behaviour[i, p - 1 : p - 1 + r] = torch.tensor(s.behaviour_logprobs, dtype=torch.float32, device=host)
        start[i] = p - 1
        if s.token_rewards is not None:
            token_rewards[i, p - 1 : p - 1 + r] = torch.tensor(s.token_rewards, dtype=torch.float32, device=host)
        elif r > 0:
            token_rewards[i, p - 2 + r] = s.reward
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention,
        mask=mask,
        behaviour_logprobs=behaviour,
        rewards=torch.tensor([s.reward for s in samples], dtype=torch.float32, device=host),
        group_ids=torch.tensor([s.group_id for s in samples], dtype=torch.long, device=host),
        versions=torch.tensor([s.version for s in samples], dtype=torch.long, device=host),
        response_start=start,
        token_rewards=token_rewards,
    ).to(device)
