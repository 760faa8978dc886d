"""One typed handle for an object that lives elsewhere (or here), with one recovery policy.

Rollout workers, data-parallel trainer ranks, the hosted critics and
actor_attn are each one object, built where it lives: in this process
(`Local`), in a spawned process of this machine (`Process`), or inside its own
Ray actor (`RayActor`). Either way the caller names the method by the object's own class:

    handle.call(RolloutWorker.update_weights, weights, version)

so a type checker checks the arguments and the result, and a reader (or a call
tracer) follows `update_weights` to its definition. Dispatch is by name on the
object, so a subclass's override is the one that runs.

When a Ray actor dies, its next call fails; what happens then is the one policy
below, whatever the object:

- `restore` given (the object's state is held outside it: a rollout worker's
  snapshot and the newest weights, actor_attn's weights): the dead actor is
  killed (one on an unreachable node must not come back beside its
  replacement), a new one is built wherever Ray finds room, `restore(handle)`
  gives it its state back, the restart goes to `<run>/restarts.jsonl`, and the
  call is asked once more. Up to `Recovery.max_restarts` restarts per
  `Recovery` (`runtime.actor_restarts`; -1: no limit), shared by the handles
  that share it (a group of workers).
- no `restore` (the critics, trainer ranks: their weights and optimizer moments
  change every step and live only there): `ActorDiedError`, which ends the
  step; the supervisor (`runtime.max_restarts`) resumes the run from its last
  checkpoint. A dead `Process` is always this case.

Ray restarts nothing by itself (max_restarts=0): a transparently restarted
actor would answer the next call with fresh state.
"""

from __future__ import annotations

import copy
import pickle
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

from cadence.runtime.supervisor import record_restart

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")


class ActorDiedError(RuntimeError):
    """An actor died and cannot be replaced in place: the run must resume from a checkpoint."""


@dataclass
class Recovery:
    """What a dead actor's handle does: `role` names it in errors and in restarts.jsonl."""

    role: str
    max_restarts: int = 0  # runtime.actor_restarts: replacements allowed (-1: no limit)
    run_dir: Path | None = None  # where restarts.jsonl is written (None: not recorded)
    restarts: int = field(default=0, init=False)  # so far, over every handle sharing this policy

    def allow(self, name: str, cause: str) -> None:
        if 0 <= self.max_restarts <= self.restarts:
            raise ActorDiedError(
                f"the {name} died ({cause}) after {self.restarts} restart(s) of {self.role} actors; "
                f"runtime.actor_restarts={self.max_restarts} allows no more"
            )

    def record(self, name: str, cause: str, entry: dict[str, Any]) -> None:
        self.restarts += 1
        if self.run_dir is not None:
            record_restart(self.run_dir, {"role": self.role, **entry, "cause": cause, "restart": self.restarts})
        print(f"the {name} died ({cause}); restarted and reloaded its state (restart {self.restarts})")


class Remote(Generic[T]):
    """A handle on one `T`: `call(T.method, *args)` runs it where the object lives."""

    def call(self, method: Callable[Concatenate[T, P], R], *args: P.args, **kwargs: P.kwargs) -> R:
        return self.result(method, self.submit(method, *args, **kwargs), args, kwargs)

    def submit(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Start the call; `result` waits for it (so a group's calls run at once)."""
        raise NotImplementedError

    def result(self, method: Callable[..., Any], pending: Any, args: tuple, kwargs: dict) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        """End the object's actor (nothing for an object in this process)."""


def call_all(
    handles: Sequence[Remote[T]], method: Callable[Concatenate[T, P], R], *args: P.args, **kwargs: P.kwargs
) -> list[R]:
    """`method(*args)` on every handle at once (trainer ranks meet in collectives, workers generate
    side by side); their answers in order."""
    pending = [h.submit(method, *args, **kwargs) for h in handles]
    return [h.result(method, p, args, kwargs) for h, p in zip(handles, pending, strict=True)]


class Local(Remote[T]):
    """The object in this process: a call is a plain method call."""

    def __init__(self, obj: T) -> None:
        self.obj = obj

    def submit(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return getattr(self.obj, method.__name__)(*args, **kwargs)

    def result(self, method: Callable[..., Any], pending: Any, args: tuple, kwargs: dict) -> Any:
        return pending


def died_error(name: str, cause: str) -> ActorDiedError:
    """The error for an object whose state lived only where it died (`name`: "critic actor")."""
    return ActorDiedError(
        f"the {name} died ({cause}); its trained state lived only in it, so the step failed: "
        "resume from the last checkpoint (cadence train --resume, or runtime.max_restarts > 0 does it by itself)"
    )


class _Host:
    """Ray actor body: builds the object in the actor's process and runs calls on it by name."""

    def __init__(self, make: Callable[[], Any], copy_args: bool = False) -> None:
        self.obj = make()
        self.copy_args = copy_args

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self.copy_args:  # Ray may hand over tensors backed by its shared object store: own copies
            args, kwargs = copy.deepcopy((args, kwargs))
        return getattr(self.obj, name)(*args, **kwargs)


def send(conn: Any, obj: Any) -> None:
    """Plain pickle, so tensors are copied: torch.multiprocessing's own pickling would put them in
    memory shared by every process they reach (two ranks updating one optimizer state)."""
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def receive(conn: Any) -> Any:
    return pickle.loads(conn.recv_bytes())


def _serve(conn: Any, make: Callable[[], Any]) -> None:
    """A spawned process's main loop: builds the object, then (name, args, kwargs) in, ("ok", result)
    or ("error", traceback) out, until ("close", ...), after which it calls the object's `close`."""
    try:
        obj = make()
        send(conn, ("ok", None))
        while True:
            name, args, kwargs = receive(conn)
            try:
                send(conn, ("ok", getattr(obj, name)(*args, **kwargs)))
            except Exception:
                send(conn, ("error", traceback.format_exc()))
            if name == "close":
                return
    except (EOFError, KeyboardInterrupt):  # the driver went away
        return
    except Exception:
        send(conn, ("error", traceback.format_exc()))


class RemoteCallError(RuntimeError):
    """The object in a `Process` raised; the message carries its traceback."""


class Process(Remote[T]):
    """The object built by `make()` (it must pickle) in a process of this machine, started with
    torch.multiprocessing (spawn) and called over a pipe. Its death is always `ActorDiedError`."""

    def __init__(self, make: Callable[[], T], name: str) -> None:
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.name = name
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(theirs, make), daemon=True)
        self.proc.start()

    def started(self) -> None:
        """Wait until the object is built (ranks build theirs together: they meet in a rendezvous)."""
        self.result(Process.started, None, (), {})

    def submit(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            send(self.conn, (method.__name__, args, kwargs))
        except OSError as err:  # BrokenPipeError: the process is gone
            raise self._dead(method) from err

    def result(self, method: Callable[..., Any], pending: Any, args: tuple, kwargs: dict) -> Any:
        try:
            status, value = receive(self.conn)
        except (EOFError, ConnectionError) as err:  # the process died (kill -9, OOM)
            raise self._dead(method) from err
        if status == "error":
            raise RemoteCallError(f"the {self.name} failed:\n{value}")
        return value

    def _dead(self, method: Callable[..., Any]) -> ActorDiedError:
        self.proc.join(timeout=1)
        return died_error(self.name, f"{method.__name__}: exit code {self.proc.exitcode}")

    def close(self) -> None:
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()


class RayActor(Remote[T]):
    """The object built by `make()` inside its own Ray actor (`options`: Ray's actor options, such as
    num_cpus, num_gpus, resources, max_concurrency); see the module docstring for recovery."""

    def __init__(
        self,
        make: Callable[[], T],
        options: dict[str, Any],
        recovery: Recovery,
        restore: Callable[[RayActor[T]], None] | None = None,
        name: str | None = None,
        entry: dict[str, Any] | None = None,
        copy_args: bool = False,
    ) -> None:
        import ray

        # Ray's actor tables name the class that make() builds, where it is one (ConfiguredRolloutWorker).
        built = getattr(make, "func", make)
        host = type(built.__name__, (_Host,), {}) if isinstance(built, type) else _Host
        self._actor_class = ray.remote(host).options(**options, max_restarts=0)
        self._make = make
        self.copy_args = copy_args
        self.recovery = recovery
        self.restore = restore
        self.name = name or f"{recovery.role} actor"  # in messages: "rollout worker 1", "actor_attn actor"
        self.entry = entry or {}  # what restarts.jsonl says of it beside role and cause (its index)
        self.actor = self._actor_class.remote(make, copy_args)

    def submit(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self.actor.call.remote(method.__name__, *args, **kwargs)

    def result(self, method: Callable[..., Any], pending: Any, args: tuple, kwargs: dict) -> Any:
        import ray

        try:
            return ray.get(pending)
        except ray.exceptions.RayActorError as err:  # it died before or during the call
            cause = f"{method.__name__}: {str(err).splitlines()[0]}"
            if self.restore is None:
                raise died_error(self.name, cause) from None
            self.replace(cause)
            return ray.get(self.submit(method, *args, **kwargs))

    def replace(self, cause: str) -> None:
        """A new actor in the dead one's place, given its state back by `restore`."""
        import ray

        self.recovery.allow(self.name, cause)
        ray.kill(self.actor)
        self.actor = self._actor_class.remote(self._make, self.copy_args)
        assert self.restore is not None
        self.restore(self)
        self.recovery.record(self.name, cause, self.entry)

    def close(self) -> None:
        import ray

        ray.kill(self.actor)
