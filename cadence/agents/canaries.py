"""Canaries: tasks whose hidden tests cannot pass honestly (the statement and the tests disagree),
mixed in with the training tasks. Any run that passes one gamed its grader, so their pass rate
is the measured hack rate (goal 0).

One group in `every` plays a canary (group key k with k % every == every - 1), graded as any
other group. `agent/canary_pass_rate` is the share of the canary runs graded since the last
metrics (one step) that passed every hidden test; above `max_pass_rate` over the last `window`
canary runs the run warns, or stops with `CanariesPassing`.
"""

from __future__ import annotations

import json
import sys
from collections import deque

from cadence.agents.config import BUILTIN_CANARIES, CanariesConfig
from cadence.data.repo_bugs import canary_rows
from cadence.yaml_config import ConfigError


class CanariesPassing(ConfigError):
    """Canary tasks pass above agent.canaries.max_pass_rate: the policy games its grader."""


class Canaries:
    def __init__(self, cfg: CanariesConfig) -> None:
        self.cfg = cfg
        if cfg.path == BUILTIN_CANARIES:
            self.rows = canary_rows()
        else:
            with open(cfg.path) as f:
                self.rows = [json.loads(line) for line in f if line.strip()]
        if not self.rows or not all(isinstance(r, dict) for r in self.rows):
            raise ValueError(f"agent.canaries.path {cfg.path!r}: expected one JSON object (a task row) per line")
        self.recent: deque[bool] = deque(maxlen=cfg.window)
        self.totals = {"runs": 0, "passed": 0}
        self.step = {"runs": 0, "passed": 0}
        self.warned = False

    def row(self, key: int) -> dict | None:
        """The canary group `key` plays, or None for a training task."""
        if key % self.cfg.every != self.cfg.every - 1:
            return None
        return self.rows[(key // self.cfg.every) % len(self.rows)]

    def record(self, passed: bool) -> None:
        """A graded canary run."""
        for counts in (self.totals, self.step):
            counts["runs"] += 1
            counts["passed"] += passed
        self.recent.append(passed)

    def check(self) -> None:
        """Past the threshold: a warning (once), or CanariesPassing (which ends the run)."""
        if len(self.recent) < self.cfg.window:
            return
        rate = sum(self.recent) / len(self.recent)
        if rate <= self.cfg.max_pass_rate:
            return
        message = (f"agent.canaries: {sum(self.recent)} of the last {len(self.recent)} canary runs passed "
                   f"(rate {rate:.2f} > agent.canaries.max_pass_rate={self.cfg.max_pass_rate:g}): the policy "
                   "passes tests that cannot pass honestly, so it games the grader")
        if self.cfg.action == "stop":
            raise CanariesPassing(message)
        if not self.warned:
            print(f"warning: {message}", file=sys.stderr, flush=True)
            self.warned = True

    def metrics(self) -> dict[str, float]:
        """Totals, and the pass rate of the canary runs graded since the last call (absent without any)."""
        out = {"agent/canary_runs_total": float(self.totals["runs"]),
               "agent/canary_passed_total": float(self.totals["passed"])}
        if self.step["runs"]:
            out["agent/canary_pass_rate"] = self.step["passed"] / self.step["runs"]
        self.step = {"runs": 0, "passed": 0}
        return out
