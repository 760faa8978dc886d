"""Run one object in its own Ray actor and call its methods as if it were local.

The critics (`runtime.critic_actor`) and actor_attn (`runtime.credit_actor`)
use this: the object is built inside the actor process by `make` (so its
torch threads and memory are the actor's), and each call's arguments and
result travel through Ray's object store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class _Host:
    """Ray actor body: builds the object in the actor process and forwards calls to it."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.obj = make()

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.obj, method)(*args)


def remote_object(
    make: Callable[[], Any], cpus: float, resources: dict[str, float] | None = None
) -> Callable[..., Any]:
    """Start an actor with `cpus` CPUs (and custom Ray `resources`, to pin it to nodes) holding
    `make()`; returns call(method, *args) -> result."""
    import ray

    actor = ray.remote(_Host).options(num_cpus=cpus, resources=resources or None).remote(make)
    return lambda method, *args: ray.get(actor.call.remote(method, *args))
