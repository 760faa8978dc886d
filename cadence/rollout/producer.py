"""What a rollout worker drives: a `GroupProducer` plays one group at a time on the hub.

A group is what GRPO compares: the answers to one prompt (RLVR), or the episodes
of one environment seed. The worker decides *when* a group may start (the async
ratio's admission rule, the weight slot, the buffer); the producer decides *what*
a group is and plays it:

    key = producer.next_key()                   a stream position or an env seed
    group = await producer.play(key, gid)       a coroutine on the hub's loop
    group is None -> filtered or lost: it will never train (admission replaces it)

A producer is built over the worker's `InferenceHub` and runs as coroutines on the hub's loop, so RLVR answers,
agent episodes and tool calls share one continuous batch and one code path.
"""

from __future__ import annotations

from typing import Protocol

from cadence.rollout.evaluate import EvalResult
from cadence.rollout.sample import Group


class GroupProducer(Protocol):
    # True when its groups wait on something outside the engine (environments): the loop must
    # keep turning while the trainer trains, so the worker always runs it in its own thread.
    needs_running_loop: bool

    def next_key(self) -> int:
        """The key of the next group (also what a resumed run counts from)."""

    async def play(self, key: int, group_id: int) -> Group | None:
        """Play one group; None when it will never train (filtered out, or lost)."""

    def on_weights(self, version: int, cancel_before: int | None) -> None:
        """New weights were handed to the hub: groups started from now on are `version`'s; open
        groups started before `cancel_before` can only go stale, so they may be cancelled."""

    async def evaluate(self, samples: int) -> EvalResult:
        """Held-out success of the hub's current weights."""

    def metrics(self) -> dict[str, float]:
        """Counters since the run began (summed over workers)."""

    def reward_report(self) -> dict:
        """The reward function's counters and first failures (see RewardGuard.stats)."""

    def state_dict(self, trained: TrainedKeys) -> dict:
        """Where a resumed run picks up, given the keys already trained on."""

    def load_state_dict(self, state: dict) -> TrainedKeys:
        """Resume; returns the keys already trained on."""

    async def cancel(self) -> None:
        """Cancel what is in flight (evaluation still works afterwards)."""

    def close(self) -> None:
        """Release what the producer holds (the reward guard's workers)."""


class TrainedKeys:
    """The keys of groups trained on: all below `below`, plus `above` (groups finish out of
    order, and some are filtered or lost, so a cursor alone cannot say what a resumed run
    still owes the trainer)."""

    def __init__(self, below: int = 0, above: set[int] | None = None) -> None:
        self.below = below
        self.above = set(above or ())

    def add(self, key: int) -> None:
        self.above.add(key)
        while self.below in self.above:
            self.above.discard(self.below)
            self.below += 1
