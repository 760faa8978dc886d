"""Held-out evaluation during a training run: before it, every `eval.every` steps, and after it.

Evaluation time is not training time: `seconds` adds up what the loop spent here.
"""

from __future__ import annotations

import time
from typing import Protocol

from cadence.config import EvalConfig
from cadence.rollout.evaluate import EvalResult


class Evaluates(Protocol):
    def evaluate(self, samples: int) -> EvalResult: ...


class Evaluator:
    def __init__(self, cfg: EvalConfig, last_step: int, workers: Evaluates, label: str) -> None:
        """`label`: what evaluation measures, as printed ("held-out pass@1", "held-out success")."""
        self.cfg, self.last_step, self.workers, self.label = cfg, last_step, workers, label
        self.seconds = 0.0
        self.final: EvalResult | None = None  # the last step's evaluation

    def before(self) -> EvalResult | None:
        """The policy before any update (eval.before), printed."""
        if not self.cfg.before:
            return None
        result = self.workers.evaluate(self.cfg.samples)
        print(f"{self.label} before training: {result.pass_at_1:.3f}")
        return result

    def due(self, step: int) -> bool:
        return bool(self.cfg.every and step % self.cfg.every == 0) or (step == self.last_step and self.cfg.after)

    def run(self, step: int) -> dict[str, float]:
        """Evaluate now; the metrics to log at `step`."""
        start = time.perf_counter()
        result = self.workers.evaluate(self.cfg.samples)
        self.seconds += time.perf_counter() - start
        self.final = result if step == self.last_step else None
        return {**result.as_metrics(), "time/eval": time.perf_counter() - start}

    def after(self) -> EvalResult | None:
        """The evaluation after training: the last step's, or one now (a run resumed after its last step)."""
        if self.cfg.after and self.final is None:
            self.final = self.workers.evaluate(self.cfg.samples)
        return self.final
