"""Environment failures made visible: the first of each kind in full, and a stop for a broken one.

An episode whose environment raises, hangs or dies is lost and retried on the
same seed, so one bad environment instance cannot crash a run. The flip side
is an environment that fails on (nearly) every episode: without a check the
run would retry, drop groups and start new ones for ever, printing nothing.
So, like the reward guard's report (cadence/observe/reward_errors.py):

* the first failure of each kind (raised / timeout / died, during make /
  reset / step) is printed with its traceback from the user's code on, and
  appended to `<run>/env_errors.log`;
* until the first group completes, a run in which at least `BROKEN_FRACTION`
  of at least `MIN_EPISODES` episodes were lost, or `GIVE_UP_GROUPS` groups
  were dropped, stops with `EnvironmentFailing`, naming the cause;
* a first observation that leaves no room for a turn in the context budget
  stops the run at once (it would fail the same way on every seed).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from cadence.envs.runner import EnvFailure
from cadence.log_clip import MAX_MESSAGE_CHARS, MAX_TRACEBACK_CHARS, clip
from cadence.yaml_config import ConfigError

BROKEN_FRACTION = 0.9  # lost / played at or above this, before any group completed, is "broken"
MIN_EPISODES = 8  # judge no fraction on fewer episodes than this
GIVE_UP_GROUPS = 3  # groups dropped (out of retries) before any completed: stop


class EnvironmentFailing(ConfigError):
    """The environment fails on (nearly) every episode: the run would learn nothing."""


class EnvErrorReport:
    """Counts episodes and their failures; reports each new kind once; decides when to stop."""

    # The words of its messages: a subclass reports on something else (cadence/agents: agent runs).
    what, setting, one, many, key = "environment", "env.name", "an episode", "episodes", "seed"
    fix = "fix the environment (try it alone: reset(seed), then step)"

    def __init__(self, env_name: str, log: Path | None = None, echo: bool = True) -> None:
        self.env_name = env_name
        self.log = log
        self.echo = echo
        self.first: dict[str, EnvFailure] = {}  # "raised during step" -> its first failure
        self.kinds: Counter[str] = Counter()

    def lost(self, failure: EnvFailure, seed: int) -> None:
        key = f"{failure.kind} during {failure.during}"
        self.kinds[key] += 1
        if key in self.first:
            return
        self.first[key] = failure
        message = clip(failure.message, MAX_MESSAGE_CHARS)  # it can quote the model's action
        text = f"{self.what} {self.env_name}: {self.one} ({self.key} {seed}) was lost: {key}: {message}\n"
        if failure.traceback:
            text += clip(failure.traceback.rstrip("\n"), MAX_TRACEBACK_CHARS) + "\n"
        if self.echo:
            print(text, end="", file=sys.stderr, flush=True)
        if self.log is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            with self.log.open("a") as f:
                f.write(text + "\n")

    def check(self, played: int, groups_done: int, groups_dropped: int) -> None:
        """Raise `EnvironmentFailing` when nothing completed and (nearly) everything failed."""
        if groups_done:
            return
        lost = sum(self.kinds.values())
        broken = played >= MIN_EPISODES and lost >= BROKEN_FRACTION * played
        if broken or groups_dropped >= GIVE_UP_GROUPS:
            common = self.kinds.most_common(1)[0][0] if self.kinds else "lost"
            message = self.first[common].message if common in self.first else ""
            raise EnvironmentFailing(
                f"{self.setting}={self.env_name}: {lost} of {played} {self.many} were lost and no group completed "
                f"({groups_dropped} dropped); most often {common}: {message}. The first failure of each kind "
                f"is in {self.log or 'the output above'}; {self.fix}"
            )

    def too_long(self, tokens: int, max_new_tokens: int, budget: int) -> EnvironmentFailing:
        return EnvironmentFailing(
            f"env.name={self.env_name}: the first observation is {tokens} tokens, and a turn needs "
            f"rollout.max_new_tokens={max_new_tokens} more: {tokens + max_new_tokens} > the context budget "
            f"{budget} (rollout.max_context_tokens, capped at the model's max_position_embeddings); shorten the "
            f"observation, lower rollout.max_new_tokens or raise rollout.max_context_tokens"
        )
