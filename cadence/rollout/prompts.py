"""An endless, reproducible stream of training prompts with a resumable cursor."""

from __future__ import annotations

import random

from cadence.data.tasks import Prompt


class PromptStream:
    """Walks the training prompts epoch by epoch, each epoch in a seeded order.

    The cursor is the stream position of the next prompt. Restoring a cursor
    (and the positions beyond it that were already trained on, `skip`) after a
    crash resumes the same sequence without repeating or skipping a prompt.
    """

    def __init__(self, prompts: list[Prompt], seed: int) -> None:
        if not prompts:
            raise ValueError("the task produced no training prompts")
        self.prompts = prompts
        self.seed = seed
        self.cursor = 0
        self.skip: set[int] = set()  # positions >= cursor to pass over (trained before a resume)
        self._epoch = -1
        self._order: list[int] = []

    def _order_for(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            self._order = list(range(len(self.prompts)))
            random.Random(self.seed * 100_003 + epoch).shuffle(self._order)
            self._epoch = epoch
        return self._order

    def next(self) -> Prompt:
        """The prompt at the cursor (its position is `cursor` before the call)."""
        while self.cursor in self.skip:
            self.skip.discard(self.cursor)
            self.cursor += 1
        epoch, index = divmod(self.cursor, len(self.prompts))
        self.cursor += 1
        return self.prompts[self._order_for(epoch)[index]]

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
