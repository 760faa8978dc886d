"""The model side of `EmbeddedEngine`: row slots of one shared KV cache and the forwards over them.

A slot is a row of `SlotKVCache` plus its `SlotInputs` (next token, position,
sampling settings). This class knows slots only, not requests: the engine
decides which request holds which slot, samples from the logits returned here
and writes the sampled tokens, positions and sampling settings into `inputs`.

Rows are left-padded to a common cache window, so the next token always goes
at the right edge; a 2D attention mask marks real columns and explicit
position_ids (count of real tokens) keep rotary positions right whatever the
padding. Released slots become holes that the next admissions reuse; holes no
admission will fill are closed by moving the last rows into them.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import PreTrainedModel

from cadence.inference.kv_cache import SlotKVCache, full_attention_layers
from cadence.inference.prefix_reuse import CachedPrefix
from cadence.inference.slots import SlotInputs


class SlotBatch:
    """Up to `max_rows` slots over `model`: prefill into slots, decode all of them, release, compact."""

    def __init__(self, model: PreTrainedModel, max_rows: int, pad_id: int, device: torch.device) -> None:
        self.model = model
        self.pad_id = pad_id
        self.device = device
        num_layers = full_attention_layers(model)  # fail early on models this engine cannot batch
        self.cache = SlotKVCache(num_layers, max_rows=max_rows, device=device)
        self.inputs = SlotInputs(pad_id, device)  # sized to the cache's row capacity
        self.holes: list[int] = []  # released slots below cache.rows, to be reused

    @property
    def rows(self) -> int:
        """Slots in use, holes included (slots 0..rows-1)."""
        return self.cache.rows

    def reserve(self, rows: int, width: int) -> None:
        """Room in the cache (and the per-slot inputs) for `rows` slots and `width` columns."""
        self.cache.reserve(rows, width)
        self.inputs.grow(self.cache.row_capacity)

    def decode(self) -> Tensor:
        """One forward for every slot feeding its last token; the next-token logits [rows, V].

        Live slots' positions advance by one; the caller samples and writes the
        tokens into `inputs.last`.
        """
        cache, n, inputs = self.cache, self.cache.rows, self.inputs
        self.reserve(n, cache.width)  # a free column for this step
        out = self.model(
            input_ids=inputs.last[:n, None],
            attention_mask=cache.decode_mask(),
            position_ids=inputs.pos[:n, None],
            past_key_values=cache,
            use_cache=True,
        )
        cache.advance()
        inputs.pos[:n] += inputs.alive[:n]  # released slots stay at position 0
        return out.logits[:, -1]

    def free_slots(self, n: int) -> list[int]:
        """`n` slots for new rows: the lowest holes first, then new rows at the end."""
        self.holes.sort()
        reused = self.holes[:n]
        del self.holes[:n]
        rows = self.cache.rows
        return reused + list(range(rows, rows + n - len(reused)))

    def fill(
        self, contexts: list[list[int]], slots: list[int], pasts: list[CachedPrefix] | None = None
    ) -> tuple[Tensor, int]:
        """One forward over `contexts`, writing their keys and values into `slots`.

        With `pasts` (the cached keys and values of each context's first
        tokens) the forward covers only the last `new` columns, `new` the
        longest uncached suffix; the rest of each row is copied in. Returns
        each context's last logits [len(contexts), V] and how many of their
        tokens went through the model.
        """
        lengths = [len(c) for c in contexts]
        width = max(lengths)
        new = width if pasts is None else max(n - len(p) for n, p in zip(lengths, pasts, strict=True))
        ids = torch.full((len(contexts), new), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(contexts), width), dtype=torch.long)
        for i, c in enumerate(contexts):  # left padding: the next token goes at the right edge
            tail = c[-new:]
            ids[i, new - len(tail) :] = torch.tensor(tail)
            mask[i, width - lengths[i] :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)[:, width - new :]
        self.reserve(max(slots) + 1, width)
        for slot, n, past in zip(slots, lengths, pasts or [], strict=False):
            kept = past.head(max(n - new, 0))  # the rest of the row goes through the forward
            self.cache.place_row(slot, kept.keys, kept.values, end=self.cache.hi - new)
        with self.cache.prefilling(slots, mask, past=width - new):
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=self.cache,
                use_cache=True,
                logits_to_keep=1,
            )
        return out.logits[:, -1], sum(min(n, new) for n in lengths)

    def refill(self, contexts: list[list[int]], groups: list[list[int]]) -> list[int]:
        """Drop every slot and fill `contexts` back, one forward per group (a weight swap's recompute).

        `groups` (indices into `contexts`, from `recompute_groups`) go in order,
        each into the next free slots. Returns the slots, in `contexts` order.
        """
        self.clear()
        slots = [0] * len(contexts)
        free = 0
        for group in groups:
            group_slots = list(range(free, free + len(group)))
            self.fill([contexts[i] for i in group], group_slots)
            for i, slot in zip(group, group_slots, strict=True):
                slots[i] = slot
            free += len(group)
        return slots

    def clear(self) -> None:
        """No slot in use: the next rows start from an empty cache."""
        self.cache.truncate(0)
        self.holes = []
        self.inputs.kill()

    def release(self, slots: list[int]) -> None:
        """Take `slots` out of the batch (other slots still live); they become holes."""
        self.cache.release(slots)
        self.inputs.kill(torch.tensor(slots, device=self.device))
        self.holes += slots
        # Rows are left-padded, so the longest row decides how many columns are needed.
        self.cache.trim(int(self.inputs.pos.max()))  # real tokens in the cache of the longest row

    def close_holes(self, keep: int) -> list[tuple[int, int]]:
        """Leave at most `keep` holes (the next admissions fill them); close the rest.

        Trailing holes are dropped; others get the batch's last row (one row
        copied). Returns the moves as (from slot, to slot), for the caller to
        follow its rows.
        """
        if len(self.holes) <= keep:
            return []
        holes = sorted(self.holes)
        rows = self.cache.rows
        dst: list[int] = []
        src: list[int] = []
        while len(holes) > keep:
            last = rows - 1
            rows -= 1
            if holes[-1] == last:
                holes.pop()
                continue
            dst.append(holes.pop(0))
            src.append(last)
        if dst:
            self.cache.move(dst, src)
            self.inputs.move(dst, src)
        self.inputs.kill(slice(rows, self.cache.rows))
        self.cache.truncate(rows)
        self.holes = holes
        return list(zip(src, dst, strict=True))


def recompute_groups(lengths: list[int], max_tokens: int, forward_tokens: int) -> list[list[int]]:
    """Rows (indices into `lengths`) grouped into forwards for a recompute, widest group first.

    A forward pads its rows to the longest, so rows are grouped by length:
    sorted, then cut into runs that minimise the padded tokens plus
    `forward_tokens` for each forward (its fixed cost, in tokens), with at most
    `max_tokens` padded tokens in a forward (at least one row). An exact
    dynamic programme over the sorted lengths: O(rows^2), rows <= the batch.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    cost = [0] + [float("inf")] * len(order)  # cost[j]: the first j sorted rows, grouped best
    start = [0] * (len(order) + 1)  # where the last group of that best grouping starts
    for end in range(1, len(order) + 1):
        width = lengths[order[end - 1]]  # sorted: the group's last row is its widest
        for first in range(end - 1, -1, -1):
            if end - first > 1 and (end - first) * width > max_tokens:
                break
            c = cost[first] + (end - first) * width + forward_tokens
            if c <= cost[end]:  # on a tie the longer last group: fewer forwards
                cost[end], start[end] = c, first
    groups = []
    end = len(order)
    while end:
        groups.append(order[start[end] : end])
        end = start[end]
    return groups  # widest first: the first forward sets the window the narrower ones fit in
