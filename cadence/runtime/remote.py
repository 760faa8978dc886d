"""Run one object in its own Ray actor and call its methods as if it were local.

The critics (`runtime.critic_actor`) and actor_attn (`runtime.credit_actor`)
use this: the object is built inside the actor process by `make` (so its
torch threads and memory are the actor's), and each call's arguments and
result travel through Ray's object store.

When the actor dies (killed, its node lost) its next call fails. What
happens then depends on where the object's state lives:

- `restore` given (actor_attn: its only state is the policy's weights, which
  the driver holds): a new actor is built wherever Ray finds room,
  `restore(call)` gives it its state back, the call is asked again, and the
  restart goes to `<run>/restarts.jsonl`. Up to `max_restarts` times (-1: no
  limit), as for rollout workers.
- no `restore` (the critics: their weights and optimizer moments change every
  step and live only in the actor): `ActorDiedError`, which ends the step;
  the supervisor (`runtime.max_restarts`) resumes the run from its last
  checkpoint, where policy and critics were saved together.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


class ActorDiedError(RuntimeError):
    """An actor holding state that exists nowhere else died: the run must resume from a checkpoint."""


class _Host:
    """Ray actor body: builds the object in the actor process and forwards calls to it."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.obj = make()

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.obj, method)(*args)


class RemoteObject:
    """call(method, *args) -> result on an object living in its own actor (see module docstring)."""

    def __init__(
        self,
        make: Callable[[], Any],
        cpus: float,
        resources: dict[str, float] | None = None,
        role: str = "actor",
        restore: Callable[[Callable[..., Any]], None] | None = None,
        max_restarts: int = 3,
        run_dir: Path | None = None,
    ) -> None:
        import ray

        # max_restarts=0: a transparently restarted actor would answer the next call without its state.
        self._actor_class = ray.remote(_Host).options(num_cpus=cpus, resources=resources or None, max_restarts=0)
        self._make = make
        self.role = role
        self.restore = restore
        self.max_restarts = max_restarts
        self.run_dir = run_dir
        self.restarts = 0
        self.actor = self._actor_class.remote(make)

    def _ask(self, method: str, *args: Any) -> Any:
        import ray

        return ray.get(self.actor.call.remote(method, *args))

    def __call__(self, method: str, *args: Any) -> Any:
        import ray

        try:
            return self._ask(method, *args)
        except ray.exceptions.RayActorError as err:
            cause = f"{method}: {str(err).splitlines()[0]}"
            if self.restore is None:
                raise ActorDiedError(
                    f"the {self.role} actor died ({cause}); its trained state lived only in it: "
                    "resume the run from the last checkpoint (runtime.max_restarts does it by itself)"
                ) from None
            self._replace(cause)
            return self._ask(method, *args)

    def _replace(self, cause: str) -> None:
        import ray

        if 0 <= self.max_restarts <= self.restarts:
            raise ActorDiedError(f"the {self.role} actor died ({cause}) after {self.restarts} restart(s); "
                                 f"runtime.actor_restarts={self.max_restarts} allows no more")
        ray.kill(self.actor)  # an actor on an unreachable node must not come back beside its replacement
        self.actor = self._actor_class.remote(self._make)
        assert self.restore is not None
        self.restore(self._ask)
        self.restarts += 1
        if self.run_dir is not None:
            from cadence.runtime.supervisor import record_restart

            record_restart(self.run_dir, {"role": self.role, "cause": cause, "restart": self.restarts})
        print(f"the {self.role} actor died ({cause}); restarted and reloaded its state (restart {self.restarts})")


def remote_object(
    make: Callable[[], Any], cpus: float, resources: dict[str, float] | None = None, **recovery: Any
) -> RemoteObject:
    """Start an actor with `cpus` CPUs (and custom Ray `resources`, to pin it to nodes) holding
    `make()`; returns call(method, *args) -> result. `recovery`: RemoteObject's role, restore,
    max_restarts and run_dir."""
    return RemoteObject(make, cpus, resources, **recovery)
