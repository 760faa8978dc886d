"""Where rollout workers live: in this process, or as Ray actors.

`WorkerGroup` gives the trainer one interface either way:
  runtime.kind=inline  one `RolloutWorker` in-process (its generation thread
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
from cadence.rollout.worker import RolloutWorker
from cadence.runtime.threads import cpu_share


class WorkerGroup:
    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.kind = cfg.runtime.kind
        n = cfg.runtime.rollout_workers
        self.spread = cfg.rollout.replicate_prompts and n > 1 and cfg.env is None  # episodes are never split
        if self.kind == "inline":
            # Synchronous: generation runs in the trainer's thread (see RolloutWorker.background).
            background = cfg.rollout.async_ratio > 0
            self.workers: list[Any] = [worker_class(cfg)(cfg, 0, 1, threads=cfg.runtime.threads, background=background)]
            return
        import ray

        if not ray.is_initialized():
            ray.init(
                address=cfg.runtime.address,
                include_dashboard=False,
                logging_level="ERROR",
                log_to_driver=True,
                configure_logging=True,
            )
        cpus = cfg.runtime.rollout_cpus
        actor = ray.remote(worker_class(cfg)).options(
            num_cpus=cpus, num_gpus=cfg.runtime.rollout_gpus, max_concurrency=4
        )
        threads = max(1, math.floor(cpus))
        self.workers = [actor.remote(cfg, i, n, threads) for i in range(n)]

    def _call(self, method: str, *args: Any) -> list[Any]:
        if self.kind == "inline":
            return [getattr(w, method)(*args) for w in self.workers]
        import ray

        return ray.get([getattr(w, method).remote(*args) for w in self.workers])

    def start(self) -> None:
        self._call("start")

    def get_batch(self, trainer_version: int) -> list[Group]:
        parts = self._call("get_batch", trainer_version)
        return join_parts(parts) if self.spread else [g for part in parts for g in part]

    def update_weights(self, state_dict: dict, version: int) -> None:
        # A generating worker swaps weights in later, between engine steps, so it gets a
        # snapshot the optimizer cannot touch: the object store's copy (ray) or a clone
        # (inline, background). A foreground worker copies them in at once: no clone needed.
        if self.kind == "ray":
            import ray

            snapshot = ray.put({k: v.detach().cpu() for k, v in state_dict.items()})
        elif self.workers[0].background:
            snapshot = {k: v.detach().clone() for k, v in state_dict.items()}
        else:
            snapshot = state_dict
        self._call("update_weights", snapshot, version)

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

    def stop(self) -> None:
        self._call("stop")

    def close(self) -> None:
        self._call("close")
        if self.kind == "ray":
            import ray

            for w in self.workers:
                ray.kill(w)


def worker_class(cfg: RunConfig) -> type:
    """Episodes for a config with an env section, task prompts otherwise."""
    if cfg.env is not None:
        from cadence.rollout.episode_worker import EpisodeWorker

        return EpisodeWorker
    return RolloutWorker


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
