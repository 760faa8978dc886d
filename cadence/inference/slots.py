"""What each KV-cache slot of `EmbeddedEngine` (`SlotBatch`) feeds the next decode step.

One tensor per field, indexed by slot, so a decode step reads its inputs and
sampling settings for the whole batch without a Python loop over rows. A slot
no request holds is "dead": pad token, position 0, alive 0 (so its position
does not advance), which keeps its row finite and harmless in the batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cadence.inference.types import SamplingParams

Index = Tensor | slice


class SlotInputs:
    """Per slot: the last sampled token (not in the cache yet), its position, whether a
    request holds the slot, and that request's temperature and top-p."""

    def __init__(self, pad_id: int, device: torch.device) -> None:
        self.pad_id = pad_id
        self.device = device
        self.last = torch.zeros(0, dtype=torch.long, device=device)
        self.pos = torch.zeros(0, dtype=torch.long, device=device)
        self.alive = torch.zeros(0, dtype=torch.long, device=device)
        self.temp = torch.zeros(0, device=device)
        self.top_p = torch.ones(0, device=device)

    @property
    def fields(self) -> tuple[Tensor, ...]:
        return self.last, self.pos, self.alive, self.temp, self.top_p

    def grow(self, capacity: int) -> None:
        """Room for `capacity` slots; new ones are dead."""
        more = capacity - self.last.shape[0]
        if more > 0:
            self.last = torch.cat([self.last, self.last.new_full((more,), self.pad_id)])
            self.pos = torch.cat([self.pos, self.pos.new_zeros(more)])
            self.alive = torch.cat([self.alive, self.alive.new_zeros(more)])
            self.temp = torch.cat([self.temp, self.temp.new_zeros(more)])
            self.top_p = torch.cat([self.top_p, self.top_p.new_ones(more)])

    def set(self, slots: list[int], last: Tensor, pos: list[int], params: list[SamplingParams]) -> None:
        """Slots that just got their cache: next input token, its position, sampling settings."""
        index = torch.tensor(slots, device=self.device)
        self.last[index] = last
        self.pos[index] = torch.tensor(pos, device=self.device)
        self.alive[index] = 1
        self.temp[index] = torch.tensor([p.temperature for p in params], device=self.device)
        self.top_p[index] = torch.tensor([p.top_p for p in params], device=self.device)

    def kill(self, index: Index = slice(None)) -> None:
        """Mark slots dead (all of them by default)."""
        self.alive[index] = 0
        self.pos[index] = 0
        self.last[index] = self.pad_id

    def move(self, dst: list[int], src: list[int]) -> None:
        """Copy slots `src` into `dst` (the engine closes holes by moving rows)."""
        d = torch.tensor(dst, device=self.device)
        s = torch.tensor(src, device=self.device)
        for t in self.fields:
            t[d] = t[s]
