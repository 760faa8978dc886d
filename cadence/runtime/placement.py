"""Where rollout workers live: in this process, or as Ray actors.

`WorkerGroup` gives the trainer one interface either way:
  runtime.kind=inline  one rollout worker in-process (its generation thread
                       shares the process with the trainer; used by tests)
  runtime.kind=ray     `runtime.rollout_workers` Ray actors, each with
                       `runtime.rollout_cpus` CPUs (or GPUs) and a matching torch
                       thread count; the trainer keeps the remaining cores.
Weights reach Ray actors through the object store: one `ray.put` per step,
shared by all workers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cadence.rollout.evaluate import EvalResult
from cadence.rollout.producer import merge_health
from cadence.rollout.sample import Group
from cadence.rollout.worker import RolloutWorker
from cadence.runtime.actors import Local, RayActor, Recovery, Remote, call_all
from cadence.runtime.cluster import check_fit, role_requests, wait_ready
from cadence.runtime.config import RuntimeConfig
from cadence.runtime.connect import connect_ray
from cadence.runtime.threads import cpu_share
from cadence.yaml_config import ConfigError


class WorkerGroup:
    def __init__(
        self, worker: Callable[..., RolloutWorker], rt: RuntimeConfig, run_dir: Path, *,
        background: bool, replicated: bool, trainer_device: str,
    ) -> None:
        """`worker(index, workers, threads[, background])` builds one rollout worker (the run's
        cadence.assemble.ConfiguredRolloutWorker). `background`: an inline worker generates ahead
        of the trainer in its own thread (rollout.async_ratio > 0; a Ray worker always does).
        `replicated`: every worker answers every prompt in part (rollout.replicate_prompts; never
        episodes), so get_batch joins the parts. `trainer_device` is checked to fit beside them."""
        self.rt = rt
        self.kind = rt.kind
        n = rt.rollout_workers
        self.spread = replicated and n > 1
        # What a restarted worker needs: its last state (taken after each batch it handed
        # out), the version it had then, and the newest weights (an object-store reference).
        self.snapshots: list[dict | None] = [None] * n
        self.snapshot_versions = [0] * n
        self.weights_ref: Any = None
        self.weights_version = 0
        self.started = False
        if self.kind == "inline":
            # Synchronous: generation runs in the trainer's thread (see RolloutWorker.background).
            self.background = background
            self.workers: list[Remote[RolloutWorker]] = [
                Local(worker(0, 1, threads=rt.threads, background=self.background))
            ]
            return
        self.background = True
        connect_ray(rt)
        check_fit(rt, trainer_device=trainer_device)  # one line naming the role that cannot be placed, before anything starts
        options = {"num_cpus": rt.rollout_cpus, "num_gpus": rt.rollout_gpus,
                   "resources": rt.rollout_resources or None, "max_concurrency": 4}
        threads = max(1, math.floor(rt.rollout_cpus))
        # One restart budget for the whole group (runtime.actor_restarts), recorded in restarts.jsonl.
        self.recovery = Recovery("rollout", rt.actor_restarts, run_dir)
        self.workers = [
            RayActor(functools.partial(worker, i, n, threads), options, self.recovery,
                     restore=functools.partial(self._restore, i), name=f"rollout worker {i}", entry={"worker": i})
            for i in range(n)
        ]
        self._wait_ready(self.workers)

    def _wait_ready(self, workers: list[RayActor]) -> None:
        rt = self.rt
        wait_ready([w.actor for w in workers], "rollout", role_requests(rt)[0].each, rt.placement_timeout_s)

    def _restore(self, i: int, worker: RayActor[RolloutWorker]) -> None:
        """Bring the replacement of dead worker `i` to where the run is: the newest weights, then its
        prompt stream and admission clock from its last snapshot (counting the weight pushes
        since), then generation. Groups it held in flight are generated again."""
        self._wait_ready([worker])
        if self.weights_ref is not None:
            worker.call(RolloutWorker.update_weights, self.weights_ref, self.weights_version)
        if self.snapshots[i] is not None:  # after the weights: it resets the admission clock
            worker.call(RolloutWorker.load_state_dict, self.snapshots[i], self.snapshot_versions[i])
        if self.started:
            worker.call(RolloutWorker.start)

    @property
    def restarts(self) -> int:
        return self.recovery.restarts if self.kind == "ray" else 0

    def _snapshot(self, version: int) -> None:
        if self.kind != "ray":
            return
        self.snapshots = call_all(self.workers, RolloutWorker.state_dict)
        self.snapshot_versions = [version] * len(self.workers)

    def start(self) -> None:
        call_all(self.workers, RolloutWorker.start)
        self.started = True

    def get_batch(self, trainer_version: int) -> list[Group]:
        parts = call_all(self.workers, RolloutWorker.get_batch, trainer_version)
        self._snapshot(trainer_version)
        return join_parts(parts) if self.spread else [g for part in parts for g in part]

    def update_weights(self, state_dict: dict, version: int) -> None:
        # A generating worker swaps weights in later, between engine steps, so it gets a
        # snapshot the optimizer cannot touch: the object store's copy (ray) or a clone
        # (inline, background). A foreground worker copies them in at once: no clone needed.
        if self.kind == "ray":
            import ray

            snapshot = ray.put({k: v.detach().cpu() for k, v in state_dict.items()})
            self.weights_ref, self.weights_version = snapshot, version
        elif self.background:
            snapshot = {k: v.detach().clone() for k, v in state_dict.items()}
        else:
            snapshot = state_dict
        call_all(self.workers, RolloutWorker.update_weights, snapshot, version)
        if self.kind == "ray":
            for state in self.snapshots:  # a worker restarted from now on had this push too
                if state is not None:
                    state["swaps"] = state.get("swaps", version) + 1
            self.snapshot_versions = [version] * len(self.workers)

    def evaluate(self, samples: int) -> EvalResult:
        return self.workers[0].call(RolloutWorker.evaluate, samples)

    def metrics(self) -> dict[str, float]:
        merged: dict[str, float] = {}
        parts = call_all(self.workers, RolloutWorker.metrics)
        for part in parts:
            for k, v in part.items():
                merged[k] = merged.get(k, 0.0) + v
        for k in list(merged):
            if k.endswith("_fraction"):
                merged[k] /= len(parts)  # fractions average; counts add up
        return merged

    def health(self) -> dict[str, Any]:
        """The producers' health reports, counters summed over workers (see merge_health)."""
        return merge_health(call_all(self.workers, RolloutWorker.health))

    def state_dict(self) -> list[dict]:
        return call_all(self.workers, RolloutWorker.state_dict)

    def load_state_dict(self, states: list[dict], version: int) -> None:
        if len(states) != len(self.workers):
            raise ConfigError(
                f"runtime.rollout_workers: the checkpoint has {len(states)} rollout workers, the config "
                f"{len(self.workers)}; resume with runtime.rollout_workers={len(states)}"
            )
        pending = [w.submit(RolloutWorker.load_state_dict, s, version) for w, s in zip(self.workers, states, strict=True)]
        for w, p, s in zip(self.workers, pending, states, strict=True):
            w.result(RolloutWorker.load_state_dict, p, (s, version), {})
        if self.kind == "ray":
            self.snapshots, self.snapshot_versions = list(states), [version] * len(states)

    def stop(self) -> None:
        call_all(self.workers, RolloutWorker.stop)

    def close(self) -> None:
        call_all(self.workers, RolloutWorker.close)
        for w in self.workers:
            w.close()


def join_parts(parts: list[list[Group]]) -> list[Group]:
    """Prompt replication over workers: each worker answered every prompt in part; join the
    parts of a group (same group id) into one group, in order of first appearance."""
    joined: dict[int, Group] = {}
    for part in parts:
        for g in part:
            whole = joined.setdefault(g.group_id, Group(group_id=g.group_id, prompt_id=g.prompt_id))
            whole.samples.extend(g.samples)
    return list(joined.values())


def trainer_threads(rt: RuntimeConfig) -> int:
    """torch threads for the trainer process: what the rollout workers leave over."""
    if rt.threads:
        return rt.threads
    if rt.kind == "inline":
        return cpu_share()
    left = cpu_share() - math.ceil(rt.rollout_cpus * rt.rollout_workers)
    return max(1, left)
