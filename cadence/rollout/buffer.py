"""The sample buffer between rollout (producer) and trainer (consumer).

Freshness rule (ROLL Flash's asynchronous ratio alpha): a group started by
policy version v may be trained on at trainer version u only while
u - v <= alpha. Older groups are dropped and counted, never silently used.
alpha = 0 is synchronous training: only groups from the current policy.
"""

from __future__ import annotations

import threading
from collections import deque

from cadence.rollout.sample import Group


class SampleBuffer:
    def __init__(self, async_ratio: int) -> None:
        self.async_ratio = async_ratio
        self._groups: deque[Group] = deque()
        self._cond = threading.Condition()
        self.dropped_groups = 0
        self.dropped_samples = 0
        self.put_groups = 0

    def put(self, group: Group) -> None:
        with self._cond:
            self._groups.append(group)
            self.put_groups += 1
            self._cond.notify_all()

    def is_fresh(self, group: Group, trainer_version: int) -> bool:
        return trainer_version - group.version <= self.async_ratio

    def evict_stale(self, trainer_version: int) -> int:
        """Drop groups too old for `trainer_version`; returns how many went."""
        with self._cond:
            stale = [g for g in self._groups if not self.is_fresh(g, trainer_version)]
            if stale:
                self._groups = deque(g for g in self._groups if self.is_fresh(g, trainer_version))
                self.dropped_groups += len(stale)
                self.dropped_samples += sum(len(g.samples) for g in stale)
            return len(stale)

    def wait_ready(self, num_groups: int, trainer_version: int, timeout: float | None = None) -> bool:
        """Block until `num_groups` fresh groups exist (stale ones are dropped); False on timeout."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self.evict_stale(trainer_version) >= 0 and len(self._groups) >= num_groups,
                timeout=timeout,
            )

    def get_batch(self, num_groups: int, trainer_version: int, timeout: float | None = None) -> list[Group]:
        """Oldest fresh groups first; blocks until `num_groups` fresh ones exist."""
        with self._cond:
            if not self.wait_ready(num_groups, trainer_version, timeout):
                raise TimeoutError(f"sample buffer: {len(self._groups)}/{num_groups} fresh groups")
            return [self._groups.popleft() for _ in range(num_groups)]

    def __len__(self) -> int:
        return len(self._groups)

    def stats(self) -> dict[str, float]:
        return {
            "buffer/depth_groups": float(len(self._groups)),
            "buffer/dropped_groups": float(self.dropped_groups),
            "buffer/dropped_samples": float(self.dropped_samples),
        }
