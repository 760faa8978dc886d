"""Virtual time: an event queue whose clock jumps to the next event.

Nothing sleeps. `at(when, fn)` files a callback; `run()` pops callbacks in time
order (ties in filing order), setting `now` to each one's time before calling
it. Callbacks file further events, so a cluster of engines and a trainer run
as a discrete-event simulation: hours of cluster time in seconds of Python.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable


class EventQueue:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()

    def at(self, when: float, fn: Callable[[], None]) -> None:
        """Call `fn` at virtual time `when` (not before now)."""
        if when < self.now:
            raise ValueError(f"cannot schedule at {when} s: the clock is already at {self.now} s")
        heapq.heappush(self._heap, (when, next(self._order), fn))

    def after(self, delay: float, fn: Callable[[], None]) -> None:
        self.at(self.now + delay, fn)

    def run(self, until: Callable[[], bool] = lambda: False) -> None:
        """Process events until `until()` holds after one, or none are left."""
        while self._heap and not until():
            self.now, _, fn = heapq.heappop(self._heap)
            fn()

    def __len__(self) -> int:
        return len(self._heap)
