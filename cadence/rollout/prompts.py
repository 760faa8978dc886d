"""An endless, reproducible stream of training prompts: the prompt at any position."""

from __future__ import annotations

import random
from collections.abc import Callable

from cadence.data.tasks import Prompt


class PromptStream:
    """Walks the training prompts block by block, each block in a seeded order.

    Given a list, every block is that list (an epoch). Given `draw(n)`, the first n
    prompts of an endless task stream, block b is the stream's next `block` prompts,
    so the order never depends on how long the run is (a resume with more steps keeps
    it). A position is the RLVR producer's group key: the worker keeps which were
    trained on, so a resumed run plays the same sequence without repeating or
    skipping a prompt.
    """

    def __init__(self, prompts: list[Prompt] | Callable[[int], list[Prompt]], seed: int, block: int = 0) -> None:
        self._draw = prompts if callable(prompts) else None
        self.block = block if self._draw is not None else len(prompts)
        self.prompts = prompts if isinstance(prompts, list) else self._draw(self.block)  # block 0
        if not self.prompts or self.block <= 0:
            raise ValueError("the task produced no training prompts")
        self._prompts_block = 0
        self.seed = seed
        self._epoch = -1
        self._order: list[int] = []

    def _order_for(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            self._order = list(range(self.block))
            random.Random(self.seed * 100_003 + epoch).shuffle(self._order)
            self._epoch = epoch
        return self._order

    def at(self, position: int) -> Prompt:
        """The prompt at stream position `position`."""
        epoch, index = divmod(position, self.block)
        return self._block_prompts(epoch)[self._order_for(epoch)[index]]

    def _block_prompts(self, block: int) -> list[Prompt]:
        if self._draw is not None and block != self._prompts_block:
            self.prompts = self._draw((block + 1) * self.block)[block * self.block :]
            self._prompts_block = block
        return self.prompts
