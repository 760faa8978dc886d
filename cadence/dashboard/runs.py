"""What the dashboard knows about run folders, read incrementally.

`RunIndex` lists the runs under a folder cheaply (status.json, summary.json,
the last line of metrics.jsonl read from the file's end; config.yaml parsed
once per change), so a page over many long runs opens without parsing any
full metrics file. `RunReader` holds one opened run: its metrics rows, the
pipeline spans and staleness of `events/*.jsonl` and recent samples, each
file tailed from the byte offset where the last read stopped.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

from cadence.dashboard.episodes import lost_episodes, tool_formats, with_tool_calls
from cadence.dashboard.matching import MATCH_TIMEOUT_S, matching
from cadence.dashboard.run_files import (
    UNREADABLE,
    dig,
    read_config,
    read_json,
    run_status,
    target_steps,
    trains_on,
)
from cadence.dashboard.tail import JsonlTail, last_record
from cadence.observe.events import EVENTS_DIR
from cadence.observe.sample_log import OLD_SAMPLES_FILE, SAMPLES_FILE

SPANS_KEPT = 20000  # per actor: the timeline shows recent minutes, not a whole week-long run
SAMPLES_KEPT = 4000
# The files a runs-list row is read from (re-read when one changes); `updated` is the newest of the first three.
ROW_FILES = ("metrics.jsonl", "status.json", "config.yaml", "summary.json", "resume_changes.yaml")


def is_run(path: Path) -> bool:
    return path.is_dir() and ((path / "config.yaml").exists() or (path / "metrics.jsonl").exists())


def _int(v: Any) -> bool:
    return type(v) is int


def _finite(v: Any) -> bool:
    t = type(v)
    return t is int or (t is float and v - v == 0.0)  # v - v is nan for inf and nan; bools are not numbers


class RunReader:
    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir
        self.name = run_dir.name
        self._lock = threading.Lock()  # SSE streams of several browsers refresh one reader
        self._metrics = JsonlTail(run_dir / "metrics.jsonl")
        self.rows: list[dict[str, Any]] = []
        self.keys: set[str] = set()
        # key -> (steps, values, rows read): built when a chart first asks, then extended
        self._columns: dict[str, tuple[list, list, int]] = {}
        self.generation = 0  # +1 whenever the rows start over (metrics.jsonl cut back on resume)
        self._event_tails: dict[str, JsonlTail] = {}
        self.spans: dict[str, deque] = {}
        self.span_count = 0  # spans ever read: the SSE cursor
        self.staleness: Counter = Counter()
        self.alpha: int | None = None
        self._samples_new = JsonlTail(run_dir / SAMPLES_FILE)
        self._samples_old_read = False
        self.samples: deque = deque(maxlen=SAMPLES_KEPT)
        self.sample_count = 0
        # Read by the event stream only once a page asked for them (a week-long run's timeline
        # is worth parsing when someone opens the pipeline view, not on every chart view).
        self.events_wanted = self.samples_wanted = False

    # -- refreshing ------------------------------------------------------------------
    def refresh(self, metrics: bool = True, events: bool = True, samples: bool = True) -> None:
        with self._lock:
            if metrics:
                self._refresh_metrics()
            if events:
                self._refresh_events()
            if samples:
                self._refresh_samples()

    def _refresh_metrics(self) -> None:
        new = self._metrics.read()
        if self._metrics.reset:
            self.rows, self.keys, self._columns, self.generation = [], set(), {}, self.generation + 1
        new = [row for row in new if _int(row.get("step"))]  # a row without a step has no place on a chart
        self.rows.extend(new)
        for row in new:
            self.keys.update(row)

    def _refresh_events(self) -> None:
        folder = self.dir / EVENTS_DIR
        if folder.is_dir():
            for path in sorted(folder.glob("*.jsonl")):
                if path.stem not in self._event_tails:
                    self._event_tails[path.stem] = JsonlTail(path)
                    self.spans[path.stem] = deque(maxlen=SPANS_KEPT)
        for actor, tail in self._event_tails.items():
            for rec in tail.read():
                if rec.get("kind") == "staleness":
                    counts = rec.get("counts")
                    if isinstance(counts, dict) and all(k.isdigit() and _int(v) for k, v in counts.items()):
                        self.staleness.update({int(k): v for k, v in counts.items()})
                    if _int(rec.get("alpha")):
                        self.alpha = rec["alpha"]
                elif isinstance(rec.get("state"), str) and _finite(rec.get("t0")) and _finite(rec.get("t1")):
                    self.spans[actor].append(rec)
                    self.span_count += 1

    def _refresh_samples(self) -> None:
        if not self._samples_old_read:  # the older half of a rotated log, once
            self._samples_old_read = True
            self._add_samples(JsonlTail(self.dir / OLD_SAMPLES_FILE).read())
        new = self._samples_new.read()
        if self._samples_new.reset:  # rotated: what we held is now samples.1.jsonl
            new = [r for r in new if (r.get("step"), r.get("group_id")) not in {(s["step"], s["group_id"]) for s in self.samples}]
        self._add_samples(new)

    def _add_samples(self, records: list[dict[str, Any]]) -> None:
        records = [r for r in records if _sample_ok(r)]
        self.samples.extend(records)
        self.sample_count += len(records)

    # -- what the API returns --------------------------------------------------------
    def series(self, keys: list[str] | None, max_points: int = 2000, match: str | None = None,
               match_timeout_s: float = MATCH_TIMEOUT_S) -> dict[str, Any]:
        """Per key (the given ones, or every key matching the regular expression `match`, or all),
        (step, value) over the rows that have it, thinned to `max_points` by taking every n-th
        point (the last point always kept). A pattern too long or too slow raises MatchError."""
        if keys is None:
            keys = sorted(self.keys - {"step"})
            if match is not None:
                keys = matching(match, keys, match_timeout_s)
        out = {}
        for key in keys:
            xs, ys = self._column(key)
            if not xs and match is not None:
                continue  # a key whose values are not numbers
            stride = max(1, math.ceil(len(xs) / max_points))
            last = [] if stride == 1 or (len(xs) - 1) % stride == 0 else [-1]
            out[key] = {"x": xs[::stride] + [xs[i] for i in last], "y": ys[::stride] + [ys[i] for i in last]}
        return {"generation": self.generation, "rows": len(self.rows), "series": out}

    def _column(self, key: str) -> tuple[list, list]:
        with self._lock:
            xs, ys, upto = self._columns.get(key, ([], [], 0))
            for row in itertools.islice(self.rows, upto, None):
                v = row.get(key)
                if v is not None and _finite(v):
                    xs.append(row["step"])
                    ys.append(v)
            self._columns[key] = (xs, ys, len(self.rows))
            return xs, ys

    def new_rows(self, since: int) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k == "step" or _finite(v)} for r in self.rows[since:]]

    def timeline(self, last_s: float = 120.0) -> dict[str, Any]:
        self.events_wanted = True
        ends = [d[-1]["t1"] for d in self.spans.values() if d]
        now = max(ends) if ends else 0.0
        spans = {actor: [s for s in d if s["t1"] >= now - last_s] for actor, d in self.spans.items()}
        return {"now": now, "spans": spans, "staleness": dict(sorted(self.staleness.items())), "alpha": self.alpha,
                "span_count": self.span_count}

    def sample_groups(self, limit: int = 50) -> list[dict[str, Any]]:
        """The newest logged groups, one entry each."""
        self.samples_wanted = True
        groups: dict[tuple[int, int], dict[str, Any]] = {}
        formats = tool_formats(read_config(self.dir)[0]) if self.samples else ()
        for s in reversed(self.samples):
            key = (s["step"], s["group_id"])
            if key not in groups:
                if len(groups) == limit:
                    break
                groups[key] = {"step": s["step"], "group_id": s["group_id"], "prompt": s["prompt"],
                               "rewards": s["group_rewards"], "versions": [], "turns": 0}
            g = groups[key]
            g["versions"].append(s["version"])
            g["turns"] = max(g["turns"], len(with_tool_calls(turns(s), formats)))
        return list(groups.values())

    def group(self, step: int, group_id: int) -> list[dict[str, Any]]:
        found = [dict(s) for s in self.samples if s["step"] == step and s["group_id"] == group_id]
        formats = tool_formats(read_config(self.dir)[0]) if found else ()
        for s in found:
            s["turns"] = with_tool_calls(turns(s), formats)
        return sorted(found, key=lambda s: s["index"])

    def details(self) -> dict[str, Any]:
        ckpt = self.dir / "checkpoints"
        status = run_status(self.dir)
        _, problem = read_config(self.dir)
        if problem and not status.get("error"):
            status["error"] = problem
        return {
            "name": self.name,
            "status": status,
            "config": _text(self.dir / "config.yaml"),
            "summary": read_json(self.dir / "summary.json"),
            "checkpoints": sorted((p.name for p in ckpt.iterdir() if p.is_dir()), key=_step_of) if ckpt.is_dir() else [],
            "reward_errors": _text(self.dir / "reward_errors.log", limit=20000),
            "lost_episodes": lost_episodes(self.dir, last_record(self.dir / "metrics.jsonl") or {}),
            "resume_changes": _text(self.dir / "resume_changes.yaml"),
        }


def _sample_ok(record: dict[str, Any]) -> bool:
    """Whether a sample-log line has what the samples view reads (a hand-edited or foreign line is skipped)."""
    if not all(_int(record.get(k)) for k in ("step", "group_id", "index")):
        return False
    if not isinstance(record.get("prompt"), str) or not isinstance(record.get("group_rewards"), list):
        return False
    tokens, mask = record.get("tokens"), record.get("loss_mask")
    if not isinstance(tokens, list) or not isinstance(mask, list) or len(tokens) != len(mask):
        return False
    logprobs, paid = record.get("logprobs"), record.get("turn_rewards")
    return (logprobs is None or isinstance(logprobs, list)) and (
        paid is None or (isinstance(paid, list) and all(isinstance(p, list) and len(p) == 2 and _int(p[0]) for p in paid)))


def turns(sample: dict[str, Any]) -> list[dict[str, Any]]:
    """A response cut where its loss mask changes: the model's turns (mask 1, they carried loss)
    and what the environment appended between them (mask 0). RLVR samples are one turn. A model
    turn of an episode that logged `turn_rewards` carries the reward the environment paid for it."""
    out: list[dict[str, Any]] = []
    paid = {i: r for i, r in sample.get("turn_rewards") or []}
    for i, (tok, m, lp) in enumerate(zip(sample["tokens"], sample["loss_mask"],
                                         sample.get("logprobs") or [None] * len(sample["tokens"]), strict=False)):
        role = "model" if m else "env"
        if not out or out[-1]["role"] != role:
            out.append({"role": role, "tokens": [], "logprobs": []})
        out[-1]["tokens"].append(tok)
        out[-1]["logprobs"].append(lp)
        if i in paid:
            out[-1]["reward"] = paid[i]
    return out


def _text(path: Path, limit: int = 200000) -> str | None:
    try:
        return path.read_text(errors="replace")[:limit]
    except OSError:
        return None


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _step_of(name: str) -> int:
    tail = name.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else -1


class RunIndex:
    """Every run under `root`, listed cheaply; a `RunReader` per run opened."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._readers: dict[str, RunReader] = {}
        self._configs: dict[str, tuple[int, tuple[dict[str, Any], str | None]]] = {}
        self._rows: dict[str, tuple[tuple, dict[str, Any]]] = {}  # name -> (files' mtimes, row)
        self._listing: tuple[float, list[dict[str, Any]]] = (0.0, [])
        self._lock = threading.Lock()

    def reader(self, name: str) -> RunReader | None:
        path = self.root / name
        if "/" in name or name.startswith(".") or not is_run(path):
            return None
        with self._lock:
            if name not in self._readers:
                self._readers[name] = RunReader(path)
            return self._readers[name]

    def runs(self, max_age_s: float = 0.0) -> list[dict[str, Any]]:
        """The runs, newest first. Every browser's event stream asks each poll: with `max_age_s`
        a listing that recent is shared, and a run whose files did not change is not read again."""
        with self._lock:
            made, listing = self._listing
            if time.monotonic() - made <= max_age_s:
                return listing
        rows = [self._cached_row(p) for p in self.root.iterdir() if is_run(p)] if self.root.is_dir() else []
        listing = sorted(rows, key=lambda r: r["updated"], reverse=True)
        with self._lock:
            self._listing = (time.monotonic(), listing)
        return listing

    def _cached_row(self, run_dir: Path) -> dict[str, Any]:
        stamp = tuple(_mtime(run_dir / f) for f in ROW_FILES)
        cached = self._rows.get(run_dir.name)
        # A run still `running` is read again anyway: its process may have died without a word.
        if cached is None or cached[0] != stamp or cached[1]["state"] == "running":
            try:
                row = self._row(run_dir)
            except Exception as err:  # whatever a bad folder holds, the other runs still list
                row = {"name": run_dir.name, "state": UNREADABLE, "error": f"{type(err).__name__}: {err}",
                       "updated": max(stamp) / 1e9}
            cached = (stamp, row)
            self._rows[run_dir.name] = cached
        return cached[1]

    def _row(self, run_dir: Path) -> dict[str, Any]:
        status = run_status(run_dir)
        last = last_record(run_dir / "metrics.jsonl") or {}
        cfg, problem = self._config(run_dir)
        summary = read_json(run_dir / "summary.json")
        reward = last.get("reward/mean")
        return {
            "name": run_dir.name,
            "state": status["state"],
            "error": status.get("error") or problem,
            "step": last.get("step", 0) if _int(last.get("step", 0)) else None,
            "steps": target_steps(cfg, run_dir),
            "task": trains_on(cfg),
            "env": _str(dig(cfg, "env", "name")),
            "algorithm": _str(dig(cfg, "algorithm", "name")),
            "credit": _str(dig(cfg, "algorithm", "credit")),
            "reward": reward if _finite(reward) else None,
            "pass_before": dig(summary, "eval_before", "pass_at_1"),
            "pass_after": dig(summary, "eval_after", "pass_at_1"),
            "started": status.get("started"),
            "updated": max((_mtime(run_dir / f) for f in ROW_FILES[:3]), default=0) / 1e9,
        }

    def _config(self, run_dir: Path) -> tuple[dict[str, Any], str | None]:
        """config.yaml read once per change: (the mapping, the problem if it could not be read)."""
        mtime = _mtime(run_dir / "config.yaml")
        cached = self._configs.get(run_dir.name)
        if cached is None or cached[0] != mtime:
            cached = (mtime, read_config(run_dir))
            self._configs[run_dir.name] = cached
        return cached[1]


def _str(v: Any) -> str | None:
    return None if v is None else str(v)
