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
import json
import math
import re
import threading
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

import yaml

from cadence.dashboard.tail import JsonlTail, last_record
from cadence.observe.events import EVENTS_DIR
from cadence.observe.run_status import read_status
from cadence.observe.sample_log import OLD_SAMPLES_FILE, SAMPLES_FILE

SPANS_KEPT = 20000  # per actor: the timeline shows recent minutes, not a whole week-long run
SAMPLES_KEPT = 4000
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def is_run(path: Path) -> bool:
    return path.is_dir() and ((path / "config.yaml").exists() or (path / "metrics.jsonl").exists())


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


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
                    self.staleness.update({int(k): v for k, v in rec.get("counts", {}).items()})
                    self.alpha = rec.get("alpha", self.alpha)
                elif "state" in rec:
                    self.spans[actor].append(rec)
                    self.span_count += 1

    def _refresh_samples(self) -> None:
        if not self._samples_old_read:  # the older half of a rotated log, once
            self._samples_old_read = True
            self._add_samples(JsonlTail(self.dir / OLD_SAMPLES_FILE).read())
        new = self._samples_new.read()
        if self._samples_new.reset:  # rotated: what we held is now samples.1.jsonl
            new = [r for r in new if (r["step"], r["group_id"]) not in {(s["step"], s["group_id"]) for s in self.samples}]
        self._add_samples(new)

    def _add_samples(self, records: list[dict[str, Any]]) -> None:
        self.samples.extend(records)
        self.sample_count += len(records)

    # -- what the API returns --------------------------------------------------------
    def series(self, keys: list[str] | None, max_points: int = 2000, match: str | None = None) -> dict[str, Any]:
        """Per key (the given ones, or every key matching the regular expression `match`, or all),
        (step, value) over the rows that have it, thinned to `max_points` by taking every n-th
        point (the last point always kept)."""
        if keys is None:
            keys = sorted(k for k in self.keys - {"step"} if match is None or re.search(match, k))
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
        for s in reversed(self.samples):
            key = (s["step"], s["group_id"])
            if key not in groups:
                if len(groups) == limit:
                    break
                groups[key] = {"step": s["step"], "group_id": s["group_id"], "prompt": s["prompt"],
                               "rewards": s["group_rewards"], "versions": [], "turns": 0}
            g = groups[key]
            g["versions"].append(s["version"])
            g["turns"] = max(g["turns"], len(turns(s)))
        return list(groups.values())

    def group(self, step: int, group_id: int) -> list[dict[str, Any]]:
        found = [dict(s) for s in self.samples if s["step"] == step and s["group_id"] == group_id]
        for s in found:
            s["turns"] = turns(s)
        return sorted(found, key=lambda s: s["index"])

    def details(self) -> dict[str, Any]:
        config_text = _text(self.dir / "config.yaml")
        ckpt = self.dir / "checkpoints"
        return {
            "name": self.name,
            "status": read_status(self.dir),
            "config": config_text,
            "summary": _read_json(self.dir / "summary.json"),
            "checkpoints": sorted((p.name for p in ckpt.iterdir() if p.is_dir()), key=_step_of) if ckpt.is_dir() else [],
            "reward_errors": _text(self.dir / "reward_errors.log", limit=20000),
            "resume_changes": _text(self.dir / "resume_changes.yaml"),
        }


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
        self._configs: dict[str, tuple[float, dict[str, Any]]] = {}
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
        stamp = tuple(_mtime(run_dir / f) for f in ("metrics.jsonl", "status.json", "summary.json", "config.yaml"))
        cached = self._rows.get(run_dir.name)
        # A run still `running` is read again anyway: its process may have died without a word.
        if cached is None or cached[0] != stamp or cached[1]["state"] == "running":
            cached = (stamp, self._row(run_dir))
            self._rows[run_dir.name] = cached
        return cached[1]

    def _row(self, run_dir: Path) -> dict[str, Any]:
        status = read_status(run_dir)
        metrics = run_dir / "metrics.jsonl"
        last = last_record(metrics) or {}
        cfg = self._config(run_dir)
        summary = _read_json(run_dir / "summary.json") or {}
        mtimes = [p.stat().st_mtime for p in (metrics, run_dir / "status.json", run_dir / "config.yaml") if p.exists()]
        before, after = summary.get("eval_before") or {}, summary.get("eval_after") or {}
        return {
            "name": run_dir.name,
            "state": status.get("state", "unknown"),
            "error": status.get("error"),
            "step": last.get("step", 0),
            "steps": (cfg.get("trainer") or {}).get("steps"),
            "task": (cfg.get("task") or {}).get("name"),
            "env": (cfg.get("env") or {}).get("name") if cfg.get("env") else None,
            "algorithm": (cfg.get("algorithm") or {}).get("name"),
            "credit": (cfg.get("algorithm") or {}).get("credit"),
            "reward": last.get("reward/mean"),
            "pass_before": before.get("pass_at_1"),
            "pass_after": after.get("pass_at_1"),
            "started": status.get("started"),
            "updated": max(mtimes) if mtimes else 0.0,
        }

    def _config(self, run_dir: Path) -> dict[str, Any]:
        path = run_dir / "config.yaml"
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return {}
        cached = self._configs.get(run_dir.name)
        if cached is None or cached[0] != mtime:
            try:
                cached = (mtime, yaml.load(path.read_text(), Loader=_Loader) or {})
            except yaml.YAMLError:
                cached = (mtime, {})
            self._configs[run_dir.name] = cached
        return cached[1]
