"""What a rollout worker drives: a `GroupProducer` plays one group at a time on the hub.

A group is what GRPO compares: the answers to one prompt (RLVR), the episodes
of one environment seed, or the runs of an agent on one task. The worker
decides *when* a group may start (the async ratio's admission rule, the weight
slot, the buffer) and *which* key it plays: keys count up from the producer's
`first_key`, and the worker keeps which were trained on (`GroupKeys`, saved in
checkpoints), so a resumed run plays every key not trained on and none twice.
The producer maps a key to a group and plays it:

    group = await producer.play(key, gid)       a coroutine on the hub's loop
    group is None -> dropped: it will never train (admission replaces it)

A key is a prompt's stream position (RLVR), an environment seed (episodes), or
a task index (agents). A producer is built over the worker's `InferenceHub`
and runs as coroutines on the hub's loop, so RLVR answers, agent episodes and
tool calls share one continuous batch and one code path.
"""

from __future__ import annotations

from typing import Protocol

from cadence.rollout.evaluate import EvalResult
from cadence.rollout.sample import Group
from cadence.yaml_config import ConfigError


class GroupProducer(Protocol):
    # True when its groups wait on something outside the engine (environments): the loop must
    # keep turning while the trainer trains, so the worker always runs it in its own thread.
    needs_running_loop: bool

    first_key: int  # the key of its first group (keys count up from it)

    async def start(self) -> None:
        """Get ready on the hub's loop (agents: start the endpoint). Called before groups and
        evaluations; a no-op when already started."""

    async def play(self, key: int, group_id: int) -> Group | None:
        """Play one group; None when it will never train (filtered out, or lost)."""

    def on_weights(self, version: int, cancel_before: int | None) -> None:
        """New weights were handed to the hub: groups started from now on are `version`'s; open
        groups started before `cancel_before` can only go stale, so they may be cancelled."""

    async def evaluate(self, samples: int) -> EvalResult:
        """Held-out success of the hub's current weights."""

    def metrics(self) -> dict[str, float]:
        """Counters since the run began (summed over workers)."""

    def health(self) -> dict:
        """How the producer's work goes, by section: "reward" (the reward function's counters and
        first failures, see RewardGuard.stats) or "episodes"/"runs" (played, lost, retried,
        dropped, first failure of each kind). Summed over workers by `merge_health`."""

    async def stop(self) -> None:
        """Cancel what is in flight and release what runs on the loop (agents: the endpoint);
        `start` and evaluation work afterwards."""

    def close(self) -> None:
        """Release what the producer holds (the reward guard's workers)."""


class GroupKeys:
    """The keys the worker hands out, and which of them were trained on.

    Keys count up from `first`. Groups finish out of order, and some are dropped, so a cursor
    alone cannot say what a resumed run still owes the trainer: every key below `trained_below`
    was trained on, and so was each key in `trained_above`. A resumed run starts at
    `trained_below` and passes over `trained_above`; the others (in flight, in the buffer,
    dropped) were never trained on, so they are played again.
    """

    def __init__(self, first: int = 0) -> None:
        self.next = first
        self.trained_below = first
        self.trained_above: set[int] = set()

    def take(self) -> int:
        while self.next in self.trained_above:  # trained on before a resume
            self.next += 1
        key, self.next = self.next, self.next + 1
        return key

    def trained(self, key: int) -> None:
        self.trained_above.add(key)
        while self.trained_below in self.trained_above:
            self.trained_above.discard(self.trained_below)
            self.trained_below += 1

    def state_dict(self) -> dict:
        return {"trained_below": self.trained_below, "trained_above": sorted(self.trained_above)}

    def load_state_dict(self, state: dict) -> None:
        """Resume from `state`: a worker's saved state, this format or an older one."""
        below, above = _trained_keys(state)
        self.next = self.trained_below = below
        self.trained_above = {k for k in above if k >= below}


def _trained_keys(state: dict) -> tuple[int, list[int]]:
    """(trained_below, trained_above) from a worker state of any release: "keys" now; before it,
    the RLVR producer's "prompts" cursor, the agent producer's "next_key" and the episode
    producer's "next_seed" (which kept no record of what was trained: everything below counts)."""
    if "keys" in state:
        keys = state["keys"]
        return int(keys["trained_below"]), [int(k) for k in keys["trained_above"]]
    if "prompts" in state:
        return int(state["prompts"]["cursor"]), [int(k) for k in state["prompts"].get("skip", ())]
    if "next_key" in state:
        return int(state["next_key"]), [int(k) for k in state.get("skip", ())]
    if "next_seed" in state:
        return int(state["next_seed"]), []
    raise ConfigError(f"checkpoint: a rollout worker's state has no group keys (fields {sorted(state)}); resume "
                      "from a checkpoint cadence wrote, or start the run afresh without --resume")


def reward_health(health: dict) -> dict:
    """The reward function's section of a health report (zeros when the rewards come from
    environments or agents, which have no reward function to fail)."""
    return health.get("reward", {"calls": 0, "errors": 0, "timeouts": 0, "first_failures": {}})


def merge_health(parts: list[dict]) -> dict:
    """Health reports of several workers as one: numbers add up, the first failure of each kind
    is the first worker's that has one."""
    merged: dict[str, dict] = {}
    for part in parts:
        for section, report in part.items():
            into = merged.setdefault(section, {"first_failures": {}})
            for key, value in report.items():
                if key == "first_failures":
                    for kind, first in value.items():
                        into["first_failures"].setdefault(kind, first)
                else:
                    into[key] = into.get(key, 0) + value
    return merged
