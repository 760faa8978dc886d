"""Turns inside an episode's token row, and their discounted returns-to-go.

An episode trains as one row: its model tokens (mask 1) come in turns, and
the environment's observation tokens (mask 0) sit between them. A turn is
therefore a maximal run of mask-1 tokens; the episode loop always puts at
least one observation token between two turns, so runs and turns coincide.
Each turn's reward r_k sits on its last model token (`Sample.token_rewards`);
a turn's reward is the sum of the token rewards inside it (with a KL
penalty in the rewards, that sum includes the turn's penalties).

For turns k = 0 .. K-1 of one row, with the discount gamma applied once per turn:

    G_k = sum_{j=k}^{K-1} gamma^(j-k) r_j        (G_{K-1} = r_{K-1};  G_k = r_k + gamma G_{k+1})
"""

from __future__ import annotations

import torch
from torch import Tensor


def turn_index(mask: Tensor) -> Tensor:
    """[B, T] long: k on the tokens of turn k (counted from 0 in each row), -1 off the mask.

    A turn starts at a mask-1 token whose left neighbour is mask 0 (or the row's start).
    """
    on = mask > 0
    before = torch.zeros_like(on)
    before[:, 1:] = on[:, :-1]
    starts = on & ~before
    return torch.where(on, starts.long().cumsum(dim=-1) - 1, torch.full_like(mask, -1, dtype=torch.long))


def turn_returns(token_rewards: Tensor, mask: Tensor, gamma: float) -> tuple[Tensor, Tensor]:
    """Per-turn returns-to-go.

    Returns (G [B, K] with G[i, k] the return of turn k of row i, 0 past a
    row's last turn; turns [B] the number of turns of each row). K is the
    largest number of turns in the batch.
    """
    index = turn_index(mask)
    turns = index.max(dim=-1).values + 1  # [B]; 0 for a row without model tokens
    K = int(turns.max().item()) if turns.numel() else 0
    rewards = torch.zeros(mask.shape[0], K + 1, dtype=token_rewards.dtype, device=token_rewards.device)
    # Column K collects the off-mask tokens (index -1), and is dropped.
    rewards.scatter_add_(1, torch.where(index >= 0, index, K), token_rewards * mask)
    rewards = rewards[:, :K]
    G = torch.zeros_like(rewards)
    running = torch.zeros(mask.shape[0], dtype=rewards.dtype, device=rewards.device)
    for k in reversed(range(K)):
        running = rewards[:, k] + gamma * running  # 0-reward columns past a row's end add nothing
        G[:, k] = running
    return G, turns


def spread_over_turns(per_turn: Tensor, mask: Tensor) -> Tensor:
    """[B, T]: per_turn[i, k] on every token of turn k of row i, 0 off the mask."""
    index = turn_index(mask)
    if per_turn.shape[1] == 0:
        return torch.zeros_like(mask, dtype=per_turn.dtype)
    picked = per_turn.gather(1, index.clamp(min=0))
    return torch.where(index >= 0, picked, torch.zeros_like(picked))
