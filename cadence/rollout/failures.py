"""Lost work, counted and bounded: one rule for environment episodes and agent runs.

A *play* (one episode, one agent run) whose environment or agent raises, hangs
or dies is *lost*: counted by kind, and replaced by a new play on the same key,
up to `max_retries` per group (*retried*). A group that runs out of retries
before it has its samples is *dropped*: it never trains, and the worker's
admission starts another in its place. So one bad instance cannot crash a run.

The flip side is an environment or agent that fails on (nearly) every play:
without a check the run would retry, drop groups and start new ones for ever,
printing nothing. So, like the reward guard's report (observe/reward_errors.py):

* the first failure of each kind (raised / timeout / died, during make /
  reset / step / run) is printed with its traceback from the user's code on,
  clipped, and appended to `<run>/env_errors.log`;
* until the first group completes, a run in which at least `BROKEN_FRACTION`
  of at least `MIN_PLAYS` plays were lost, or `GIVE_UP_GROUPS` groups were
  dropped, stops with `ProducerFailing`, naming the cause.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from cadence.log_clip import MAX_MESSAGE_CHARS, MAX_TRACEBACK_CHARS, clip
from cadence.yaml_config import ConfigError

BROKEN_FRACTION = 0.9  # lost / played at or above this, before any group completed, is "broken"
MIN_PLAYS = 8  # judge no fraction on fewer plays than this
GIVE_UP_GROUPS = 3  # groups dropped (out of retries) before any completed: stop


class ProducerFailing(ConfigError):
    """The environment or agent fails on (nearly) every play: the run would learn nothing."""


class Failure(Protocol):
    """Why one play was lost (an `EnvFailure` from an environment, a `RunFailure` from an agent)."""

    @property
    def kind(self) -> str: ...  # raised | timeout | died

    @property
    def during(self) -> str: ...  # make | reset | step | run

    @property
    def message(self) -> str: ...

    @property
    def traceback(self) -> str: ...


@dataclass
class RunFailure:
    """An agent run lost: `kind` raised | timeout, during its run."""

    kind: str
    message: str
    traceback: str = ""
    during: str = "run"


@dataclass(frozen=True)
class Words:
    """How the messages name what is played: environment episodes or agent runs."""

    what: str  # "environment"
    setting: str  # the config field naming it
    one: str  # "an episode"
    many: str  # "episodes"
    key: str  # what a group is played on: "seed"
    fix: str


EPISODES = Words("environment", "env.name", "an episode", "episodes", "seed",
                 "fix the environment (try it alone: reset(seed), then step)")
AGENT_RUNS = Words("agent", "agent.name", "a run", "runs", "task",
                   "fix the agent (try it alone against `cadence serve`)")


@dataclass
class OpenGroup:
    """A group being played: the policy version it started under, its plays in flight, and the
    retries it has used."""

    version: int
    plays: set[asyncio.Task] = field(default_factory=set)
    retries: int = 0


G = TypeVar("G", bound=OpenGroup)


def stale(groups: dict[int, G], min_version: int) -> list[G]:
    """The open groups started before `min_version`: finished, they could only be dropped as stale."""
    return [g for g in list(groups.values()) if g.version < min_version]


class Failures:
    """A producer's plays and lost work; reports each new failure kind once; decides when to stop."""

    def __init__(self, name: str, words: Words = EPISODES, log: Path | None = None, echo: bool = True) -> None:
        self.name = name  # the env or agent name, as configured
        self.words = words
        self.log = log
        self.echo = echo
        self.first: dict[str, Failure] = {}  # "raised during step" -> its first failure
        self.kinds: Counter[str] = Counter()  # "raised during step" -> how many
        self.lost_by_kind: Counter[str] = Counter()  # "raised" -> how many
        self.played = 0  # plays that ended, finished or lost
        self.retried = 0
        self.cancelled = 0
        self.groups_done = 0  # groups complete enough to train
        self.groups_dropped = 0  # groups that ran out of retries: never trained

    @property
    def lost(self) -> int:
        return self.lost_by_kind.total()

    def finished(self) -> None:
        self.played += 1

    def record_lost(self, failure: Failure, key: object, played: bool = False) -> None:
        """Count a lost play (`played`: counted as played already) and report its kind if new."""
        self.played += not played
        self.lost_by_kind[failure.kind] += 1
        kind = f"{failure.kind} during {failure.during}"
        self.kinds[kind] += 1
        if kind not in self.first:
            self.first[kind] = failure
            self._report(failure, kind, key)

    def retry(self, group: OpenGroup, max_retries: int) -> bool:
        """Whether `group` may replace a lost play, `max_retries` per group (counted if so)."""
        if group.retries >= max_retries:
            return False
        group.retries += 1
        self.retried += 1
        return True

    def group_ended(self, kept: bool) -> None:
        if kept:
            self.groups_done += 1
        else:
            self.groups_dropped += 1

    def check(self) -> None:
        """Raise `ProducerFailing` when nothing completed and (nearly) everything failed."""
        if self.groups_done:
            return
        lost, played, dropped, w = self.lost, self.played, self.groups_dropped, self.words
        broken = played >= MIN_PLAYS and lost >= BROKEN_FRACTION * played
        if broken or dropped >= GIVE_UP_GROUPS:
            common = self.kinds.most_common(1)[0][0] if self.kinds else "lost"
            message = self.first[common].message if common in self.first else ""
            raise ProducerFailing(
                f"{w.setting}={self.name}: {lost} of {played} {w.many} were lost and no group completed "
                f"({dropped} dropped); most often {common}: {message}. The first failure of each kind "
                f"is in {self.log or 'the output above'}; {w.fix}"
            )

    def health(self) -> dict:
        """Counters and the first failure of each kind, as text (what `health()` reports)."""
        return {"played": self.played, "lost": self.lost, "retried": self.retried, "cancelled": self.cancelled,
                "groups": self.groups_done, "groups_dropped": self.groups_dropped,
                "first_failures": {k: f.traceback or f.message for k, f in self.first.items()}}

    def _report(self, failure: Failure, kind: str, key: object) -> None:
        w = self.words
        message = clip(failure.message, MAX_MESSAGE_CHARS)  # it can quote the model's action
        text = f"{w.what} {self.name}: {w.one} ({w.key} {key}) was lost: {kind}: {message}\n"
        if failure.traceback:
            text += clip(failure.traceback.rstrip("\n"), MAX_TRACEBACK_CHARS) + "\n"
        if self.echo:
            print(text, end="", file=sys.stderr, flush=True)
        if self.log is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            with self.log.open("a") as f:
                f.write(text + "\n")
