"""Pipeline timeline events: what each actor (trainer, rollout-N) was doing, when.

One JSONL file per actor under `<run>/events/`, one line per *span* (a state
held from t0 to t1), never one per engine step: an actor that stays in
`generating` for a thousand steps writes one line. Lines are buffered and
reach the disk at most `flush_s` seconds late (and at close), so the cost on
the hot path is a comparison and, on a change of state, one dict. Times are
wall-clock (time.time()) so actors in different processes line up.

    {"actor": "rollout-0", "state": "generating", "t0": 1700000000.1, "t1": 1700000000.9, "step": 3}
    {"actor": "trainer", "kind": "staleness", "step": 3, "alpha": 2, "counts": {"0": 120, "1": 8}}
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from cadence.observe.metrics import truncate_jsonl

EVENTS_DIR = "events"


class EventWriter:
    """Append-only JSONL with a write buffer flushed every `flush_s` seconds."""

    def __init__(self, path: Path, flush_s: float = 1.0) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.flush_s = flush_s
        self._file = path.open("a")
        self._pending: list[str] = []
        self._flushed_at = time.time()
        self._lock = threading.Lock()  # the trainer and a worker thread may share one writer

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            self._pending.append(line)
            if time.time() - self._flushed_at >= self.flush_s:
                self._flush()

    def flush(self) -> None:
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        if self._pending and not self._file.closed:
            self._file.write("".join(self._pending))
            self._file.flush()
        self._pending.clear()
        self._flushed_at = time.time()

    def close(self) -> None:
        with self._lock:
            self._flush()
            self._file.close()


def cut_back(path: Path, last_step: int) -> None:
    """Drop the per-step records (not the spans) a killed run wrote after its checkpoint's step:
    the resumed run writes them again, and a dashboard must not count a step twice. The spans
    stay: that time was really spent, and the timeline shows it."""
    truncate_jsonl(path, last_step, keep=lambda record: "kind" not in record)


class Timeline:
    """The states one actor passes through, written as spans. A Timeline given no run folder
    (events switched off), or one that does not exist (a worker built outside a run, as in
    tests: the recipe creates the folder first), records nothing."""

    def __init__(self, run_dir: Path | None, actor: str, flush_s: float = 1.0) -> None:
        self.actor = actor
        live = run_dir is not None and run_dir.is_dir()
        self.writer = EventWriter(run_dir / EVENTS_DIR / f"{actor}.jsonl", flush_s) if live else None
        self._state: str | None = None
        self._since = 0.0
        self._step: int | None = None
        self._lock = threading.Lock()

    def enter(self, state: str, step: int | None = None) -> None:
        """From now on the actor is in `state` (the span of the previous state ends here)."""
        if self.writer is None or (state == self._state and step == self._step):
            return
        with self._lock:
            now = time.time()
            self._end(now)
            self._state, self._since, self._step = state, now, step

    def record(self, **fields: Any) -> None:
        """Any other event of this actor (e.g. a step's staleness histogram)."""
        if self.writer is not None:
            self.writer.write({"actor": self.actor, "t": time.time(), **fields})

    def flush(self) -> None:
        """Write what the buffer holds now (before a checkpoint: a kill after it loses nothing
        the resumed run will not redo)."""
        if self.writer is not None:
            self.writer.flush()

    def _end(self, now: float) -> None:
        if self._state is not None:
            span = {"actor": self.actor, "state": self._state, "t0": round(self._since, 4), "t1": round(now, 4)}
            if self._step is not None:
                span["step"] = self._step
            self.writer.write(span)

    def close(self) -> None:
        if self.writer is None:
            return
        with self._lock:
            self._end(time.time())
            self._state = None
        self.writer.close()
