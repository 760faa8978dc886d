"""The virtual clock: events in time order, ties in filing order, time jumps, no going back."""

from __future__ import annotations

import pytest

from cadence.simulate.clock import EventQueue


def test_events_run_in_time_order_and_the_clock_jumps_to_each():
    queue, seen = EventQueue(), []
    queue.at(5.0, lambda: seen.append(("b", queue.now)))
    queue.at(1.5, lambda: seen.append(("a", queue.now)))
    queue.at(5.0, lambda: seen.append(("c", queue.now)))  # same time: after b, filed first
    queue.run()
    assert seen == [("a", 1.5), ("b", 5.0), ("c", 5.0)]
    assert queue.now == 5.0 and len(queue) == 0


def test_callbacks_schedule_more_and_run_stops_when_told():
    queue, ticks = EventQueue(), []

    def tick() -> None:
        ticks.append(queue.now)
        queue.after(0.25, tick)

    queue.at(0.0, tick)
    queue.run(until=lambda: len(ticks) == 5)
    assert ticks == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert len(queue) == 1  # the next tick is filed, not run


def test_the_past_cannot_be_scheduled():
    queue = EventQueue()
    queue.at(2.0, lambda: None)
    queue.run()
    with pytest.raises(ValueError, match="already at 2.0"):
        queue.at(1.0, lambda: None)
