"""Token-balanced shares of a batch for data-parallel trainer ranks.

A rank's step time is its token count (forward and backward are linear in
tokens for these lengths), so the batch is split by tokens, not by rows:
greedy longest-first into N bins, each sample going whole to the bin that
holds the fewest tokens so far (ties: the lower rank). Every rank computes the
same bins from the same lengths, so no rank needs to be told its share.
"""

from __future__ import annotations

import torch
from torch import Tensor


def token_balanced_bins(lengths: Tensor, n: int) -> list[Tensor]:
    """Split row indices into `n` bins of near-equal total length: sorted index tensors.

    Longest first (LPT scheduling), each row to the currently lightest bin; with at
    least `n` rows no bin is empty. Equal lengths keep their original order. The bins
    live on `lengths`' device (index_copy_ wants its indices beside the data).
    """
    if n < 1:
        raise ValueError(f"token_balanced_bins: n must be >= 1, got {n}")
    device, lengths = lengths.device, lengths.cpu()  # a Python loop over rows: one copy, not a GPU sync per row
    order = lengths.argsort(descending=True, stable=True).tolist()
    loads = [0] * n
    bins: list[list[int]] = [[] for _ in range(n)]
    for row in order:
        lightest = min(range(n), key=lambda b: (loads[b], b))
        bins[lightest].append(row)
        loads[lightest] += int(lengths[row])
    return [torch.tensor(sorted(b), dtype=torch.long, device=device) for b in bins]


def rank_rows(rows: Tensor, lengths: Tensor, rank: int, world: int) -> Tensor:
    """The entries of `rows` that `rank` of `world` trains on, balanced by `lengths[rows]`."""
    if world == 1:
        return rows
    return rows[token_balanced_bins(lengths[rows], world)[rank]]
