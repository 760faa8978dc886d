"""A KV cache of reusable row slots over a preallocated, growing column window.

`EmbeddedEngine` keeps one left-padded batch in flight. With transformers'
`DynamicCache` that costs a full copy of the cache on every decode step
(`torch.cat` of one new column, in every layer) and another each time a row
finishes (`batch_select_indices`). `SlotKVCache` keeps, per layer, keys and
values in buffers of shape [row capacity, heads, column capacity, head_dim]:

- the live columns are a window [lo, hi) shared by every row (rows are
  left-padded to it; `mask` marks each row's real columns). A decode step
  writes column `hi` in place. `trim` drops leading columns by moving `lo`,
  copying nothing. When `hi` reaches the capacity, the window is copied into
  fresh buffers `growth` times its width, so a column costs O(1) amortised
  copies however long a request runs; buffers much wider than the window
  (long requests have left) shrink the same way, so memory follows the
  live window and the strided views attention reads stay dense;
- rows are slots: a finished row is only masked out (`release`) and its slot
  goes to the next admitted request, whose prefill writes its keys and values
  in place (`prefilling`); `move` closes holes no request will fill by
  copying single rows.

The model sees an ordinary `Cache`: in a decode step `update` writes the new
column and returns views [:rows, :, lo:hi + 1] of the buffers; in a prefill it
writes the new rows' keys and values into their slots, right-aligned at `hi`,
and returns them as they are, since prompts attend only to themselves. A
prefill with a `past` (an episode's next turn, see `prefix_reuse.py`) attends
to that too: the rows' cached keys and values are put in place first
(`place_row`), right before the new columns, and `update` returns past and
new together.

Masked columns must hold finite numbers (attention weight 0 times NaN is
NaN). Buffers are allocated uninitialised (see `_buffer`), so every column a
row's window covers is written first: prompt or zero padding when the row
joins, each decode column, zeros where the window widens; what an earlier
occupant of a slot left there is finite.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer


class SlotKVLayer(CacheLayerMixin):
    """One layer's key/value buffers; the shared window lives in the parent cache."""

    is_sliding = False

    def __init__(self, parent: SlotKVCache) -> None:
        super().__init__()
        self.parent = parent

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        p = self.parent
        self.dtype, self.device = key_states.dtype, key_states.device
        heads, k_dim, v_dim = key_states.shape[1], key_states.shape[-1], value_states.shape[-1]
        self.keys = _buffer((p.row_capacity, heads, p.capacity, k_dim), self.dtype, self.device)
        self.values = _buffer((p.row_capacity, heads, p.capacity, v_dim), self.dtype, self.device)
        self.is_initialized = True

    def update(
        self, key_states: Tensor, value_states: Tensor, *args, **kwargs
    ) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        p = self.parent
        if p._prefill_slots is not None:
            slots, start = p._prefill_slots, p.hi - key_states.shape[-2]
            self.keys[slots, :, start : p.hi] = key_states
            self.values[slots, :, start : p.hi] = value_states
            if p._prefill_past:  # place_row wrote the past and zeroed what is left of the window
                first = start - p._prefill_past
                return self.keys[slots, :, first : p.hi], self.values[slots, :, first : p.hi]
            if start > p.lo:  # the window is wider than the prompts: padding
                self.keys[slots, :, p.lo : start] = 0
                self.values[slots, :, p.lo : start] = 0
            return key_states, value_states
        if key_states.shape[0] != p.rows or key_states.shape[-2] != 1:
            raise RuntimeError(
                f"SlotKVCache decodes one column for all {p.rows} rows, "
                f"got {tuple(key_states.shape)}"
            )
        if p.hi >= p.capacity:
            raise RuntimeError("SlotKVCache is full; call reserve() before the forward")
        self.keys[: p.rows, :, p.hi] = key_states[:, :, 0]
        self.values[: p.rows, :, p.hi] = value_states[:, :, 0]
        return self.keys[: p.rows, :, p.lo : p.hi + 1], self.values[: p.rows, :, p.lo : p.hi + 1]

    def get_seq_length(self) -> int:
        p = self.parent
        return p._prefill_past if p._prefill_slots is not None else p.width

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def _relayout(self, rows: int, row_cap: int, col_cap: int, src: slice, dst: slice) -> None:
        if not self.is_initialized:
            return
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = _buffer((row_cap, old.shape[1], col_cap, old.shape[3]), old.dtype, old.device)
            new[:rows, :, dst] = old[:rows, :, src]
            new[:rows, :, : dst.start] = 0
            setattr(self, name, new)

    def _zero(self, rows: int, cols: slice) -> None:
        if self.is_initialized:
            self.keys[:rows, :, cols] = 0
            self.values[:rows, :, cols] = 0

    def _move(self, dst: Tensor, src: Tensor, cols: slice) -> None:
        if self.is_initialized:
            self.keys[dst, :, cols] = self.keys[src, :, cols]
            self.values[dst, :, cols] = self.values[src, :, cols]

    def _place(self, slot: int, keys: Tensor, values: Tensor, lo: int, end: int) -> None:
        start = end - keys.shape[-2]
        self.keys[slot, :, lo:start] = 0
        self.values[slot, :, lo:start] = 0
        self.keys[slot, :, start:end] = keys
        self.values[slot, :, start:end] = values


class SlotKVCache(Cache):
    """Row slots x a growing column window, for a continuous-batching decode loop.

    State: `rows` slots in use (live or released; the engine tracks which),
    the window [lo, hi) of width `width`, and `mask` [row_capacity, capacity]
    (1 = real token) of which [:rows, lo:hi] is live. Capacities grow by
    `growth` (rows up to `max_rows`) when `reserve` asks for more.
    """

    def __init__(
        self,
        num_layers: int,
        max_rows: int,
        growth: float = 1.5,
        min_columns: int = 32,
        device: torch.device | str = "cpu",
    ) -> None:
        if growth <= 1:
            raise ValueError(f"growth must be > 1, got {growth}")
        self.max_rows = max_rows
        self.growth = growth
        self.min_columns = min_columns
        self.rows = 0
        self.lo = self.hi = 0
        self.row_capacity = 0
        self.capacity = 0
        self.mask = torch.zeros((0, 0), dtype=torch.long, device=device)
        self.relayouts = 0  # how many times the buffers were reallocated (for tests and stats)
        self._prefill_slots: slice | Tensor | None = None
        self._prefill_past = 0  # columns before a prefill's own that it attends to
        super().__init__(layers=[SlotKVLayer(self) for _ in range(num_layers)])

    @property
    def width(self) -> int:
        """Columns in the window: the cache length every row is padded to."""
        return self.hi - self.lo

    # ---- shape -----------------------------------------------------------

    def reserve(self, rows: int, width: int) -> None:
        """Make room for `rows` slots, a window of at least `width` columns and one more column.

        A window widened on the left gets masked-out, zeroed columns. Relayouts
        (new buffers, window copied) happen only when a capacity runs out, the
        window cannot widen in place, or the buffers are far wider than needed.
        """
        if rows > self.max_rows:
            raise ValueError(f"{rows} rows exceed max_rows={self.max_rows}")
        if self.rows == 0 and width < self.capacity:
            self.lo = self.hi = width  # empty: start the window anywhere in the buffers we have
        width = max(width, self.width)
        row_cap = self.row_capacity
        if rows > row_cap:
            row_cap = min(self.max_rows, max(rows, 2 * row_cap))
        fits = self.hi - width >= 0 and self.hi < self.capacity
        # After long requests leave, a buffer much wider than the window wastes memory and
        # spreads the strided views attention reads (measured slower), so it shrinks too.
        oversized = self.capacity > max(self.min_columns, 2 * self.growth * (width + 1))
        if fits and not oversized and row_cap == self.row_capacity:
            self._widen(width)
            return
        col_cap = self.capacity
        if not fits or oversized:
            col_cap = max(self.min_columns, int(self.growth * (width + 1)))
        self._relayout(row_cap, col_cap, width)

    def _widen(self, width: int) -> None:
        lo = self.hi - width
        if lo < self.lo:
            self.mask[:, lo : self.lo] = 0
            for layer in self.layers:
                layer._zero(self.rows, slice(lo, self.lo))
            self.lo = lo

    def _relayout(self, row_cap: int, col_cap: int, width: int) -> None:
        """New buffers; the window moves to [0, width), right-aligned, padded on the left."""
        old = self.width
        src, dst = slice(self.lo, self.hi), slice(width - old, width)
        for layer in self.layers:
            layer._relayout(self.rows, row_cap, col_cap, src, dst)
        mask = self.mask.new_zeros((row_cap, col_cap))
        mask[: self.rows, dst] = self.mask[: self.rows, src]
        self.mask = mask
        self.row_capacity, self.capacity = row_cap, col_cap
        self.lo, self.hi = 0, width
        self.relayouts += 1

    def trim(self, width: int) -> None:
        """Keep the last `width` columns of the window (the rest is padding in every live row)."""
        if width < self.width:
            self.lo = self.hi - width

    def truncate(self, rows: int) -> None:
        """Stop using slots from `rows` on (the engine has moved or released their rows)."""
        self.rows = rows
        if rows == 0:
            self.lo = self.hi = 0

    # ---- rows ------------------------------------------------------------

    def release(self, slots: list[int]) -> None:
        """Mask out finished rows; their slots stay in the batch until reused or truncated."""
        self.mask[slots] = 0

    def move(self, dst: list[int], src: list[int]) -> None:
        """Copy rows `src` into slots `dst` (all distinct, no slot in both)."""
        if not dst:
            return
        d = torch.tensor(dst, device=self.mask.device)
        s = torch.tensor(src, device=self.mask.device)
        cols = slice(self.lo, self.hi)
        for layer in self.layers:
            layer._move(d, s, cols)
        self.mask[d] = self.mask[s]

    def read_row(self, slot: int, length: int) -> tuple[Tensor, Tensor]:
        """Copies of the keys and values of the last `length` columns of `slot`.

        Shapes [layers, heads, length, head_dim]: a row's real tokens are the
        last columns of the window, so this is its whole context when `length`
        is its token count.
        """
        if not 0 < length <= self.width:
            raise ValueError(f"cannot read {length} columns of a {self.width}-column window")
        cols = slice(self.hi - length, self.hi)
        keys = torch.stack([layer.keys[slot, :, cols] for layer in self.layers])
        values = torch.stack([layer.values[slot, :, cols] for layer in self.layers])
        return keys, values

    def place_row(self, slot: int, keys: Tensor, values: Tensor, end: int) -> None:
        """Write a row's cached keys and values (from `read_row`) into columns [end - n, end).

        The columns of the window before them are zeroed (padding). For a
        prefill with a past: `end` is where the forward's own columns start.
        """
        if keys.shape[0] != len(self.layers) or not self.lo <= end - keys.shape[-2]:
            raise RuntimeError(f"{tuple(keys.shape)} keys do not fit before column {end}")
        for layer, k, v in zip(self.layers, keys, values, strict=True):
            layer._place(slot, k, v, self.lo, end)

    @contextmanager
    def prefilling(self, slots: list[int], mask: Tensor, past: int = 0) -> Iterator[None]:
        """Within: a forward over the rows of `slots` writes their keys and values in place.

        `mask` [len(slots), w] is their left-padded attention mask; the
        prompts go in columns [hi - w, hi), so `reserve(.., w)` must come
        first. Slots at or past `rows` join the batch. With `past` > 0 the
        forward covers only the last w - past of those columns and attends to
        the first `past`, which `place_row` filled.
        """
        width = mask.shape[1]
        if width > self.width or max(slots) >= self.row_capacity:
            raise RuntimeError("reserve() the rows and the prompt width before prefilling")
        if not 0 <= past < width:
            raise ValueError(f"past={past} must leave a column of the {width} to compute")
        if not set(range(self.rows, max(slots) + 1)) <= set(slots):
            raise RuntimeError(f"slots {slots} leave a gap after the {self.rows} in use")
        first = slots[0]
        if slots == list(range(first, first + len(slots))):
            index: slice | Tensor = slice(first, first + len(slots))
        else:
            index = torch.tensor(slots, device=self.mask.device)
        self.mask[index, self.lo : self.hi] = 0
        self.mask[index, self.hi - width : self.hi] = mask.to(self.mask)
        self._prefill_slots, self._prefill_past = index, past
        try:
            yield
        finally:
            self._prefill_slots, self._prefill_past = None, 0
        self.rows = max(self.rows, max(slots) + 1)

    # ---- decode ----------------------------------------------------------

    def decode_mask(self) -> Tensor:
        """The attention mask of a decode step: the window plus the new column, real in all rows."""
        if self.hi >= self.capacity:
            raise RuntimeError("reserve() before decoding")
        self.mask[: self.rows, self.hi] = 1
        return self.mask[: self.rows, self.lo : self.hi + 1]

    def advance(self) -> None:
        """After a decode forward: the new column joins the window."""
        self.hi += 1


def _buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """Uninitialised key/value storage.

    Not zeroed: fresh pages cost a page fault each, so zeroing a buffer whose
    rows are mostly unused (few requests left in a wide batch) costs more than
    the copies it replaces. Every column of the window is written before
    attention reads it instead: by the decode step that adds it, by a
    prefill (prompt or padding) for a row that joins, or zeroed when the
    window widens to the left.
    """
    return torch.empty(shape, dtype=dtype, device=device)


def full_attention_layers(model: PreTrainedModel) -> int:
    """The number of cache layers, if every one is plain full attention.

    Left-padded rows sharing one column window assume every layer sees every
    column, which sliding-window and linear-attention layers do not.
    """
    layers = DynamicCache(config=model.config).layers
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        kinds = sorted({type(layer).__name__ for layer in layers})
        raise NotImplementedError(f"EmbeddedEngine needs full-attention layers only, got {kinds}")
    return len(layers)
