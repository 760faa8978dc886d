"""SlotBatch's slot bookkeeping and how a weight swap's recompute groups rows into forwards
(the recompute's log-probs are checked end to end in test_weight_swap.py)."""

from __future__ import annotations

import torch

from cadence.inference.slot_batch import SlotBatch, recompute_groups
from cadence.models.tiny import tiny_model


def test_recompute_groups_rows_of_similar_length_widest_first():
    # sorted lengths 3, 4, 10, 11 (indices 2, 0, 3, 1): one forward pads to 4 x 11 = 44 tokens;
    # two forwards, (3, 4) and (10, 11), cost 8 + 22 padded tokens plus a forward's fixed cost
    lengths = [4, 11, 3, 10]
    assert recompute_groups(lengths, 1 << 15, forward_tokens=100) == [[2, 0, 3, 1]]
    assert recompute_groups(lengths, 1 << 15, forward_tokens=10) == [[3, 1], [2, 0]]  # 30 + 20 < 44 + 10
    assert recompute_groups(lengths, 1 << 15, forward_tokens=0) == [[1], [3], [0], [2]]
    assert recompute_groups(lengths, 21, forward_tokens=100) == [[1], [3], [2, 0]]  # <= 21 padded tokens
    assert recompute_groups([], 8, forward_tokens=0) == []


def test_recompute_groups_bound_applies_to_each_forward_and_ties_take_fewer_forwards():
    # (10, 10) fits 20 padded tokens and saves a forward; the 1 goes alone
    assert recompute_groups([1, 10, 10], 20, forward_tokens=100) == [[1, 2], [0]]
    # a row wider than the bound still goes, alone, and the others are not held to its width
    assert recompute_groups([50, 3, 4], 8, forward_tokens=100) == [[0], [1, 2]]
    assert recompute_groups([5, 5], 1 << 15, forward_tokens=0) == [[0, 1]]  # 10 padded tokens either way


def test_free_slots_reuse_the_lowest_holes_then_append():
    batch = SlotBatch(tiny_model(), max_rows=8, pad_id=0, device=torch.device("cpu"))
    with torch.inference_mode():
        batch.fill([[5, 6, 7]] * 5, list(range(5)))
        batch.release([3, 1])
    assert batch.free_slots(1) == [1]
    assert batch.free_slots(3) == [3, 5, 6]  # the last hole, then two new rows
    assert batch.free_slots(2) == [5, 6] and batch.holes == []
