"""SlotKVCache: in-place decode columns, geometric growth, row slots, window moves.

These drive the cache the way a model forward does (`update` per layer) with
made-up key/value states, and compare against plain concatenation.
"""

from __future__ import annotations

import pytest
import torch

from cadence.inference import kv_cache
from cadence.inference.kv_cache import SlotKVCache

HEADS, DIM, LAYERS = 2, 3, 2


@pytest.fixture(autouse=True)
def nan_kv_buffers(monkeypatch):
    """Fresh buffers hold NaN, so reading a column the cache never wrote shows up."""

    def poisoned(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(kv_cache, "_buffer", poisoned)


def states(rows: int, cols: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.randn(rows, HEADS, cols, DIM, generator=gen),
        torch.randn(rows, HEADS, cols, DIM, generator=gen),
    )


def prefill(cache: SlotKVCache, slots: list[int], mask: torch.Tensor, gen: torch.Generator):
    """What a model forward over new prompts does: one update per layer, in prefill mode."""
    written = []
    with cache.prefilling(slots, mask):
        assert cache.get_seq_length() == 0
        assert cache.get_mask_sizes(mask.shape[1], 0) == (mask.shape[1], 0)
        for layer in range(LAYERS):
            k, v = states(len(slots), mask.shape[1], gen)
            out_k, out_v = cache.update(k, v, layer)
            assert out_k is k and out_v is v  # prompts attend to themselves only
            written.append((k, v))
    return written


def decode(cache: SlotKVCache, gen: torch.Generator):
    """One decode forward: reserve a column, then one update per layer; returns the views."""
    cache.reserve(cache.rows, cache.width)
    mask = cache.decode_mask()
    assert mask.shape == (cache.rows, cache.width + 1)
    assert cache.get_mask_sizes(1, 0) == (cache.width + 1, 0)
    new, views = [], []
    for layer in range(LAYERS):
        k, v = states(cache.rows, 1, gen)
        views.append(cache.update(k, v, layer))
        new.append((k, v))
    cache.advance()
    return new, views


def test_decode_writes_in_place_and_grows_geometrically():
    gen = torch.Generator().manual_seed(0)
    cache = SlotKVCache(LAYERS, max_rows=4, growth=1.5, min_columns=4)
    cache.reserve(3, 2)
    mask = torch.tensor([[0, 1], [1, 1], [1, 1]])
    written = prefill(cache, [0, 1, 2], mask, gen)
    ref = [[k, v] for k, v in written]  # what DynamicCache would hold
    assert cache.rows == 3 and cache.width == 2
    assert cache.mask[:3, cache.lo : cache.hi].tolist() == mask.tolist()

    pointers, relayouts = set(), cache.relayouts
    for _ in range(200):
        new, views = decode(cache, gen)
        for layer, ((k, v), (view_k, view_v)) in enumerate(zip(new, views, strict=True)):
            ref[layer][0] = torch.cat([ref[layer][0], k], dim=-2)
            ref[layer][1] = torch.cat([ref[layer][1], v], dim=-2)
            assert torch.equal(view_k, ref[layer][0]) and torch.equal(view_v, ref[layer][1])
        pointers.add(cache.layers[0].keys.data_ptr())
        assert cache.capacity <= 1.5 * (cache.width + 1) + 1  # slack stays bounded
    assert cache.width == 202
    assert cache.mask[:3, cache.lo : cache.hi].sum(1).tolist() == [201, 202, 202]
    # Buffers are reallocated only when full: a handful of times in 200 steps, not every step.
    assert 3 <= cache.relayouts - relayouts <= 10 and len(pointers) <= cache.relayouts


def test_released_slot_is_reused_in_place_and_rows_move():
    gen = torch.Generator().manual_seed(1)
    cache = SlotKVCache(LAYERS, max_rows=4, min_columns=8)
    cache.reserve(3, 3)
    prefill(cache, [0, 1, 2], torch.ones(3, 3, dtype=torch.long), gen)
    for _ in range(2):
        decode(cache, gen)
    row2 = [layer.keys[2, :, cache.lo : cache.hi].clone() for layer in cache.layers]

    cache.release([1])
    assert cache.mask[1].sum() == 0 and cache.rows == 3
    relayouts = cache.relayouts
    cache.reserve(2, 2)  # a 2-token prompt into slot 1: fits, nothing reallocated
    written = prefill(cache, [1], torch.tensor([[1, 1]]), gen)
    assert cache.relayouts == relayouts and cache.rows == 3
    assert cache.mask[1, cache.lo : cache.hi].tolist() == [0, 0, 0, 1, 1]
    for layer, (k, _) in zip(cache.layers, written, strict=True):
        assert torch.equal(layer.keys[1, :, cache.hi - 2 : cache.hi], k[0])
        assert not layer.keys[1, :, cache.lo : cache.hi - 2].any()  # padding, zeroed

    cache.release([0])
    cache.move([0], [2])  # close the hole with the last row, then drop the last slot
    cache.truncate(2)
    for layer, before in zip(cache.layers, row2, strict=True):
        assert torch.equal(layer.keys[0, :, cache.lo : cache.hi], before)
    assert cache.mask[0, cache.lo : cache.hi].tolist() == [1, 1, 1, 1, 1]
    _, views = decode(cache, gen)
    assert views[0][0].shape[0] == 2


def test_trim_then_widen_in_place_or_by_relayout():
    gen = torch.Generator().manual_seed(2)
    cache = SlotKVCache(LAYERS, max_rows=2, min_columns=8)
    cache.reserve(2, 4)  # room for a second row later
    prefill(cache, [0], torch.ones(1, 4, dtype=torch.long), gen)
    for _ in range(6):
        decode(cache, gen)
    keep = cache.layers[0].keys[0, :, cache.hi - 3 : cache.hi].clone()
    cache.trim(3)  # only moves the window's left edge
    assert cache.width == 3 and torch.equal(cache.layers[0].keys[0, :, cache.lo : cache.hi], keep)

    prefill(cache, [1], torch.tensor([[0, 1, 1]]), gen)  # joins after the trim

    relayouts = cache.relayouts
    cache.reserve(2, 5)  # a longer prompt: the window widens to the left, in place
    assert cache.relayouts == relayouts and cache.width == 5
    assert cache.mask[:2, cache.lo : cache.hi].tolist() == [[0, 0, 1, 1, 1], [0, 0, 0, 1, 1]]
    _, views = decode(cache, gen)  # columns new to the window hold zeros, not stale memory
    assert all(not t.isnan().any() for kv in views for t in kv)
    cache.release([1])
    prefill(cache, [1], torch.tensor([[0, 1, 1, 1, 1]]), gen)

    cache.reserve(2, cache.hi + 4)  # wider than the columns left of `hi`: relayout
    assert cache.relayouts == relayouts + 1 and cache.lo == 0
    assert cache.mask[0, cache.lo : cache.hi].tolist() == [0] * (cache.width - 4) + [1] * 4
    assert torch.equal(cache.layers[0].keys[0, :, cache.hi - 4 : cache.hi - 1], keep)
    _, views = decode(cache, gen)
    assert all(not t.isnan().any() for kv in views for t in kv)


def test_oversized_buffers_shrink_and_an_empty_cache_restarts_in_place():
    gen = torch.Generator().manual_seed(3)
    cache = SlotKVCache(LAYERS, max_rows=2, growth=1.5, min_columns=4)
    cache.reserve(2, 2)
    prefill(cache, [0, 1], torch.tensor([[1, 1], [0, 1]]), gen)
    for _ in range(60):
        decode(cache, gen)
    wide = cache.capacity
    cache.release([0])
    cache.trim(2)  # the long row left: 2 real columns remain
    decode(cache, gen)
    assert cache.capacity < wide / 4 and cache.width == 3

    cache.truncate(0)
    assert cache.rows == 0 and cache.width == 0
    relayouts = cache.relayouts
    cache.reserve(1, 3)
    assert cache.relayouts == relayouts and cache.width == 3  # reuses the buffers it has


def test_misuse_is_refused():
    cache = SlotKVCache(LAYERS, max_rows=2)
    with pytest.raises(ValueError):
        cache.reserve(3, 1)
    with pytest.raises(ValueError):
        SlotKVCache(LAYERS, max_rows=2, growth=1.0)
    cache.reserve(1, 2)
    with pytest.raises(RuntimeError):  # prompt wider than the reserved window
        with cache.prefilling([0], torch.ones(1, 4, dtype=torch.long)):
            pass


def test_a_row_read_out_is_placed_back_and_a_prefill_attends_to_it():
    gen = torch.Generator().manual_seed(4)
    cache = SlotKVCache(LAYERS, max_rows=3, min_columns=8)
    cache.reserve(2, 4)
    prefill(cache, [0, 1], torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]), gen)
    decode(cache, gen)
    keys, values = cache.read_row(0, 4)  # row 0: 3 prompt tokens + 1 decoded
    assert keys.shape == (LAYERS, HEADS, 4, DIM)
    assert torch.equal(keys[1], cache.layers[1].keys[0, :, cache.hi - 4 : cache.hi])
    with pytest.raises(ValueError):
        cache.read_row(0, cache.width + 1)

    # Slot 2 continues row 0: its first 3 tokens copied in, 2 new ones through the "forward".
    cache.reserve(3, 5)
    cache.place_row(2, keys[:, :, :3], values[:, :, :3], end=cache.hi - 2)
    mask = torch.ones(1, 5, dtype=torch.long)
    with cache.prefilling([2], mask, past=3):
        assert cache.get_seq_length() == 3 and cache.get_mask_sizes(2, 0) == (5, 0)
        for layer in range(LAYERS):
            k, v = states(1, 2, gen)
            out_k, out_v = cache.update(k, v, layer)
            assert torch.equal(out_k[0], torch.cat([keys[layer, :, :3], k[0]], dim=-2))
            assert torch.equal(out_v[0], torch.cat([values[layer, :, :3], v[0]], dim=-2))
    window = slice(cache.lo, cache.hi)
    assert cache.mask[2, window].tolist() == [0] * (cache.width - 5) + [1] * 5
    assert not cache.layers[0].keys[2, :, cache.lo : cache.hi - 5].isnan().any()  # padding zeroed
    with pytest.raises(ValueError):  # nothing left to compute
        with cache.prefilling([2], mask, past=5):
            pass
