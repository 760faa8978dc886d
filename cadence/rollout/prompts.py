"""An endless, reproducible stream of training prompts with a resumable cursor."""

from __future__ import annotations

import random
from collections.abc import Callable

from cadence.data.tasks import Prompt


class PromptStream:
    """Walks the training prompts block by block, each block in a seeded order.

    Given a list, every block is that list (an epoch). Given `draw(n)`, the first n
    prompts of an endless task stream, block b is the stream's next `block` prompts,
    so the order never depends on how long the run is (a resume with more steps keeps
    it). The cursor is the stream position of the next prompt. Restoring a cursor
    (and the positions beyond it that were already trained on, `skip`) after a
    crash resumes the same sequence without repeating or skipping a prompt.
    """

    def __init__(self, prompts: list[Prompt] | Callable[[int], list[Prompt]], seed: int, block: int = 0) -> None:
        self._draw = prompts if callable(prompts) else None
        self.block = block if self._draw is not None else len(prompts)
        self.prompts = prompts if isinstance(prompts, list) else self._draw(self.block)  # block 0
        if not self.prompts or self.block <= 0:
            raise ValueError("the task produced no training prompts")
        self._prompts_block = 0
        self.seed = seed
        self.cursor = 0
        self.skip: set[int] = set()  # positions >= cursor to pass over (trained before a resume)
        self._epoch = -1
        self._order: list[int] = []

    def _order_for(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            self._order = list(range(self.block))
            random.Random(self.seed * 100_003 + epoch).shuffle(self._order)
            self._epoch = epoch
        return self._order

    def next(self) -> Prompt:
        """The prompt at the cursor (its position is `cursor` before the call)."""
        while self.cursor in self.skip:
            self.skip.discard(self.cursor)
            self.cursor += 1
        epoch, index = divmod(self.cursor, self.block)
        self.cursor += 1
        return self._block_prompts(epoch)[self._order_for(epoch)[index]]

    def _block_prompts(self, block: int) -> list[Prompt]:
        if self._draw is not None and block != self._prompts_block:
            self.prompts = self._draw((block + 1) * self.block)[block * self.block :]
            self._prompts_block = block
        return self.prompts

    def peek_position(self) -> int:
        """The position `next()` will hand out."""
        position = self.cursor
        while position in self.skip:
            position += 1
        return position

    def state_dict(self) -> dict:
        return {"cursor": self.cursor, "skip": sorted(self.skip)}

    def load_state_dict(self, state: dict) -> None:
        self.cursor = int(state["cursor"])
        self.skip = {int(p) for p in state.get("skip", ())}
