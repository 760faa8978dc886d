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

import math
from typing import Any

from cadence.config import ConfigError, RunConfig
from cadence.rollout.evaluate import EvalResult
from cadence.rollout.sample import Group
from cadence.runtime.cluster import check_fit, role_requests, wait_ready
from cadence.runtime.connect import connect_ray
from cadence.runtime.supervisor import record_restart
from cadence.runtime.threads import cpu_share


class WorkerGroup:
    def __init__(self, cfg: RunConfig, worker: type) -> None:
        """`worker(cfg, index, workers, threads[, background])` builds one rollout worker
        (cadence.assemble.ConfiguredRolloutWorker)."""
        self.cfg = cfg
        self.kind = cfg.runtime.kind
        n = cfg.runtime.rollout_workers
        self.spread = cfg.rollout.replicate_prompts and n > 1 and cfg.env is None  # episodes are never split
        if self.kind == "inline":
            # Synchronous: generation runs in the trainer's thread (see RolloutWorker.background).
            background = cfg.rollout.async_ratio > 0
            self.workers: list[Any] = [worker(cfg, 0, 1, threads=cfg.runtime.threads, background=background)]
            return
        import ray

        connect_ray(cfg.runtime)
        rt = cfg.runtime
        check_fit(rt, trainer_device=cfg.trainer.device)  # one line naming the role that cannot be placed, before anything starts
        cpus = rt.rollout_cpus
        # No restarts by Ray itself (max_restarts=0): a transparently restarted actor would take
        # the next call with fresh state (base weights, first prompts). A dead actor fails its
        # next call instead, and `_recover` starts a replacement wherever Ray finds room.
        self.actor = ray.remote(worker).options(
            num_cpus=cpus, num_gpus=rt.rollout_gpus, resources=rt.rollout_resources or None,
            max_concurrency=4, max_restarts=0,
        )
        self.threads = max(1, math.floor(cpus))
        self.workers = [self.actor.remote(cfg, i, n, self.threads) for i in range(n)]
        wait_ready(self.workers, "rollout", role_requests(rt)[0].each, rt.placement_timeout_s)
        # What a restarted worker needs: its last state (taken after each batch it handed
        # out), the version it had then, and the newest weights (an object-store reference).
        self.snapshots: list[dict | None] = [None] * n
        self.snapshot_versions = [0] * n
        self.weights_ref: Any = None
        self.weights_version = 0
        self.started = False
        self.restarts = 0

    def _call(self, method: str, *args: Any) -> list[Any]:
        if self.kind == "inline":
            return [getattr(w, method)(*args) for w in self.workers]
        import ray

        refs = [getattr(w, method).remote(*args) for w in self.workers]
        answers = []
        for i, ref in enumerate(refs):
            try:
                answers.append(ray.get(ref))
            except ray.exceptions.RayActorError as err:
                # The actor died (before or during the call): a replacement takes its place,
                # gets its state back, and is asked the call again.
                self._recover(i, f"{method}: {str(err).splitlines()[0]}")
                answers.append(ray.get(getattr(self.workers[i], method).remote(*args)))
        return answers

    def _recover(self, i: int, cause: str) -> None:
        """Replace dead worker `i` and bring it to where the run is: the newest weights, then its
        prompt stream and admission clock from its last snapshot (counting the weight pushes
        since), then generation. Groups it held in flight are generated again."""
        import ray

        rt = self.cfg.runtime
        if 0 <= rt.actor_restarts <= self.restarts:
            raise RuntimeError(
                f"rollout worker {i} died ({cause}) after {self.restarts} restart(s) of rollout workers; "
                f"runtime.actor_restarts={rt.actor_restarts} allows no more"
            )
        ray.kill(self.workers[i])  # a worker whose node is merely unreachable must not come back
        worker = self.workers[i] = self.actor.remote(self.cfg, i, len(self.workers), self.threads)
        wait_ready([worker], "rollout", role_requests(rt)[0].each, rt.placement_timeout_s)
        if self.weights_ref is not None:
            ray.get(worker.update_weights.remote(self.weights_ref, self.weights_version))
        if self.snapshots[i] is not None:  # after the weights: it resets the admission clock
            ray.get(worker.load_state_dict.remote(self.snapshots[i], self.snapshot_versions[i]))
        if self.started:
            ray.get(worker.start.remote())
        self.restarts += 1
        record_restart(self.cfg.run_dir(), {"role": "rollout", "worker": i, "cause": cause, "restart": self.restarts})
        print(f"rollout worker {i} died ({cause}); restarted and reloaded its state (restart {self.restarts})")

    def _snapshot(self, version: int) -> None:
        if self.kind != "ray":
            return
        self.snapshots = self._call("state_dict")
        self.snapshot_versions = [version] * len(self.workers)

    def start(self) -> None:
        self._call("start")
        self.started = True

    def get_batch(self, trainer_version: int) -> list[Group]:
        parts = self._call("get_batch", trainer_version)
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
        elif self.workers[0].background:
            snapshot = {k: v.detach().clone() for k, v in state_dict.items()}
        else:
            snapshot = state_dict
        self._call("update_weights", snapshot, version)
        if self.kind == "ray":
            for state in self.snapshots:  # a worker restarted from now on had this push too
                if state is not None:
                    state["swaps"] = state.get("swaps", version) + 1
            self.snapshot_versions = [version] * len(self.workers)

    def evaluate(self, samples: int) -> EvalResult:
        return self._call_first("evaluate", samples)

    def _call_first(self, method: str, *args: Any) -> Any:
        if self.kind == "inline":
            return getattr(self.workers[0], method)(*args)
        import ray

        return ray.get(getattr(self.workers[0], method).remote(*args))

    def metrics(self) -> dict[str, float]:
        merged: dict[str, float] = {}
        parts = self._call("metrics")
        for part in parts:
            for k, v in part.items():
                merged[k] = merged.get(k, 0.0) + v
        for k in list(merged):
            if k.endswith("_fraction"):
                merged[k] /= len(parts)  # fractions average; counts add up
        return merged

    def reward_report(self) -> dict[str, Any]:
        """Reward counters summed over workers; the first failure of each kind from any of them."""
        merged: dict[str, Any] = {"calls": 0, "errors": 0, "timeouts": 0, "first_failures": {}}
        for part in self._call("reward_report"):
            for key in ("calls", "errors", "timeouts"):
                merged[key] += part[key]
            for kind, first in part["first_failures"].items():
                merged["first_failures"].setdefault(kind, first)
        return merged

    def state_dict(self) -> list[dict]:
        return self._call("state_dict")

    def load_state_dict(self, states: list[dict], version: int) -> None:
        if len(states) != len(self.workers):
            raise ConfigError(
                f"runtime.rollout_workers: the checkpoint has {len(states)} rollout workers, the config "
                f"{len(self.workers)}; resume with runtime.rollout_workers={len(states)}"
            )
        if self.kind == "inline":
            self.workers[0].load_state_dict(states[0], version)
            return
        import ray

        ray.get([w.load_state_dict.remote(s, version) for w, s in zip(self.workers, states, strict=True)])
        self.snapshots, self.snapshot_versions = list(states), [version] * len(states)

    def stop(self) -> None:
        self._call("stop")

    def close(self) -> None:
        self._call("close")
        if self.kind == "ray":
            import ray

            for w in self.workers:
                ray.kill(w)


def join_parts(parts: list[list[Group]]) -> list[Group]:
    """Prompt replication over workers: each worker answered every prompt in part; join the
    parts of a group (same group id) into one group, in order of first appearance."""
    joined: dict[int, Group] = {}
    for part in parts:
        for g in part:
            whole = joined.setdefault(g.group_id, Group(group_id=g.group_id, prompt_id=g.prompt_id))
            whole.samples.extend(g.samples)
    return list(joined.values())


def trainer_threads(cfg: RunConfig) -> int:
    """torch threads for the trainer process: what the rollout workers leave over."""
    if cfg.runtime.threads:
        return cfg.runtime.threads
    if cfg.runtime.kind == "inline":
        return cpu_share()
    left = cpu_share() - math.ceil(cfg.runtime.rollout_cpus * cfg.runtime.rollout_workers)
    return max(1, left)
