"""Reward failures made visible: the first of each kind in full, and a stop for a broken function.

`RewardGuard` turns every failing reward into 0.0 so that one bad response
cannot crash a run. The flip side is that a reward function that *always*
fails gives a run that trains on nothing and still exits 0. This module
closes that gap:

* the first failure of each kind (exception type, "Timeout", "WorkerDied", ...)
  is printed with its traceback, the prompt and the response, and appended to
  `<run>/reward_errors.log`;
* while the first `CHECK_STEPS` training steps run (and after the held-out
  evaluation before training, which scores with the same function), a run in
  which at least `BROKEN_FRACTION` of all scored responses failed stops with
  `RewardFunctionError`: such a function is broken, not unlucky.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from cadence.log_clip import MAX_MESSAGE_CHARS, MAX_TRACEBACK_CHARS, clip
from cadence.yaml_config import ConfigError

CHECK_STEPS = 3  # training steps during which a (nearly) always failing reward stops the run
BROKEN_FRACTION = 0.9  # failed / scored at or above this is "nearly every reward fails"
MIN_SCORED = 8  # judge no fraction on fewer responses than this

SIGNATURE = "fn(prompt, response) -> float, prompt.text / prompt.answer / prompt.meta"


class RewardFunctionError(ConfigError):
    """The reward function fails on (nearly) every response: the run would learn nothing."""


class RewardErrorReport:
    """Follows the guard's counters across a run; reports new failure kinds once."""

    def __init__(self, run_dir: Path, echo: bool = True) -> None:
        self.path = run_dir / "reward_errors.log"
        self.echo = echo
        self.reported: set[str] = set()

    def update(self, report: dict[str, Any], step: int) -> None:
        """Print and log failure kinds not seen before; `report` is the reward section of `WorkerGroup.health()`."""
        for kind, first in report.get("first_failures", {}).items():
            if kind in self.reported:
                continue
            self.reported.add(kind)
            text = describe_failure(kind, first, step)
            with self.path.open("a") as log:
                log.write(text + "\n")
            if self.echo:
                print(text, file=sys.stderr, flush=True)

    def review(self, report: dict[str, Any], step: int) -> None:
        """After `step` (0: before training): show new failure kinds, then stop a run whose reward
        function (nearly) always fails."""
        self.update(report, step)
        self.check(report, step)

    def check(self, report: dict[str, Any], step: int) -> None:
        """Raise `RewardFunctionError` when (nearly) every response so far failed (early steps only)."""
        if step > CHECK_STEPS:
            return
        when = "before training" if step == 0 else f"in the first {step} step{'s' * (step > 1)}"
        problem = reward_broken(report, when, self.path)
        if problem:
            raise RewardFunctionError(problem)


def reward_broken(report: dict[str, Any], when: str, log: Path | None = None) -> str | None:
    """The one-line error for a reward that failed on (nearly) every response, else None."""
    scored = int(report.get("calls", 0))
    failed = int(report.get("errors", 0)) + int(report.get("timeouts", 0))
    if scored < MIN_SCORED or failed < BROKEN_FRACTION * scored:
        return None
    kind, first = next(iter(report.get("first_failures", {}).items()), ("?", {}))
    where = f"traceback in {log}" if log is not None else "traceback above"
    return (
        f"reward.name: the reward function failed on {failed} of {scored} responses {when} "
        f"({first.get('message') or kind}); {where}. It is called as {SIGNATURE}"
    )


def describe_failure(kind: str, first: dict[str, Any], step: int) -> str:
    """A readable block: what failed, on what input, and the reward function's traceback."""
    lines = [
        f"reward function failure ({kind}, first seen by step {step}): {clip(str(first.get('message')), MAX_MESSAGE_CHARS)}",
        f"  prompt:   {first.get('prompt')!r}",
        f"  response: {first.get('response')!r}",
    ]
    if first.get("traceback"):
        lines.append("  " + clip(first["traceback"].rstrip(), MAX_TRACEBACK_CHARS).replace("\n", "\n  "))
    lines.append("  (the response scored 0.0; later failures of this kind are only counted)")
    return "\n".join(lines)
