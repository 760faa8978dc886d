"""Data-parallel trainer ranks: N processes in one torch.distributed group.

`runtime.trainer_workers=N` (N > 1) runs the trainer as N `TrainerRank`s:
  runtime.kind=inline  N processes on this machine started with
                       torch.multiprocessing (spawn), talking to this one over pipes
  runtime.kind=ray     N Ray actors in one placement group, one bundle of
                       `runtime.trainer_cpus` CPUs (and `trainer_gpus` GPUs, 1 when
                       unset and trainer.device is cuda) per rank
The ranks join one process group at rank 0's address (NCCL when `trainer.device` is cuda,
each rank on its own GPU; gloo on CPU) and each builds its own `PolicyTrainer` with a
`DataParallel` view of the group.
The driver (the recipe) sends every rank the same call with the whole batch;
the ranks split the work among themselves (`cadence.train.data_parallel`) and
answer identically, so the driver keeps rank 0's answer.

`TrainerGroup` is a `Trainer` (`cadence.train.protocol`), as a `PolicyTrainer`
is: the recipe calls both the same way.
Each rank is a typed handle (`cadence.runtime.actors`): a spawned `Process` or a
`RayActor`; a dead rank fails the step with `TrainerRankError`.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cadence.rollout.sample import Group
from cadence.runtime.actors import (
    ActorDiedError,
    Process,
    RayActor,
    Recovery,
    Remote,
    RemoteCallError,
    call_all,
)
from cadence.runtime.cluster import rank_gpus
from cadence.runtime.config import RuntimeConfig
from cadence.runtime.connect import connect_ray
from cadence.train.config import TrainerConfig
from cadence.train.data_parallel import DataParallel
from cadence.train.device import rank_device

# Builds one rank's trainer; must pickle (a module-level function or a functools.partial of one).
Build = Callable[[DataParallel], Any]

# A rank's death: the step fails, and the run resumes from its last checkpoint (one error for
# every object whose state lives only where it runs).
TrainerRankError = ActorDiedError


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rendezvous() -> str:
    """tcp://ip:port for the group's rendezvous, on the node this runs on (rank 0's bundle)."""
    import ray

    ip = ray.util.get_node_ip_address()
    return f"tcp://{ip}:{free_port(ip)}"


class TrainerRank:
    """One rank: joins the group, builds its trainer, and runs the driver's calls on it."""

    def __init__(
        self, rank: int, world: int, build: Build, strategy: str, cpu_offload: bool, threads: int, device: str,
        init_method: str,
    ) -> None:
        import torch.distributed as dist

        torch.set_num_threads(threads)
        place = rank_device(device, rank)  # trainer.device, resolved in the rank's process (the GPUs it sees)
        backend = "nccl" if place.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world)
        self.trainer = build(DataParallel(rank, world, strategy, cpu_offload, place))

    def step(self, groups: list[Group]) -> tuple[dict[str, float], int]:
        """The step's metrics and the version it leaves."""
        return self.trainer.step(groups), self.trainer.version

    def weights(self) -> dict[str, torch.Tensor]:
        return self.trainer.weights()

    def state_dict(self) -> dict:
        return self.trainer.state_dict()

    def load_state_dict(self, state: dict, folder: Path | None) -> None:
        self.trainer.load_state_dict(state, folder)

    def save(self, folder: Path) -> None:
        self.trainer.save(folder)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class TrainerGroup:
    def __init__(
        self, build: Build, trainer_cfg: TrainerConfig, runtime: RuntimeConfig, model: torch.nn.Module | None = None
    ) -> None:
        """`model`: the driver's copy of the policy (for the Hugging Face export), given the
        ranks' weights by every `weights()` call."""
        self.world = runtime.trainer_workers
        self.model = model
        self.kind = runtime.kind
        threads = max(1, int(runtime.trainer_cpus)) if self.kind == "ray" else 1
        rank = functools.partial(
            TrainerRank, world=self.world, build=build, strategy=trainer_cfg.strategy,
            cpu_offload=trainer_cfg.cpu_offload, threads=threads, device=trainer_cfg.device,
        )
        if self.kind == "ray":
            self.ranks = self._start_ray(rank, runtime, rank_gpus(runtime, trainer_cfg.device))
        else:  # one GPU per inline rank: checked when the config loads (check_runtime)
            init = f"tcp://127.0.0.1:{free_port()}"
            procs = [Process(functools.partial(rank, r, init_method=init), self._name(r)) for r in range(self.world)]
            for p in procs:  # every rank joined (or the first failure is raised)
                p.started()
            self.ranks = procs
        self.version = 0

    def _name(self, rank: int) -> str:
        return f"trainer rank {rank} of {self.world}"

    def _start_ray(self, rank: Callable[..., TrainerRank], runtime: RuntimeConfig, gpus: float) -> list[Remote[TrainerRank]]:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        connect_ray(runtime)
        bundle = {
            "CPU": runtime.trainer_cpus, **({"GPU": gpus} if gpus else {}),
            **runtime.trainer_resources,
        }
        cannot = (
            f"runtime.trainer_workers={self.world}: the Ray cluster cannot place {self.world} ranks of {bundle} "
            f"(it has {ray.cluster_resources()}); lower runtime.trainer_workers or runtime.trainer_cpus/trainer_gpus"
        )
        total = ray.cluster_resources()
        if any(self.world * amount > total.get(kind, 0) for kind, amount in bundle.items()):
            raise RuntimeError(cannot)
        self.pg = placement_group([bundle] * self.world, strategy="PACK")
        ready, _ = ray.wait([self.pg.ready()], timeout=120)  # others (rollout actors) may hold resources
        if not ready:
            ray.util.remove_placement_group(self.pg)
            raise RuntimeError(cannot)

        def on_bundle(i: int) -> PlacementGroupSchedulingStrategy:
            return PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i)

        init = ray.get(ray.remote(rendezvous).options(num_cpus=0, scheduling_strategy=on_bundle(0)).remote())
        # No restore: a rank's shard of weights and moments lived only in it (TrainerRankError).
        recovery = Recovery("trainer")
        ranks = [
            RayActor(
                functools.partial(rank, r, init_method=init),
                {"num_cpus": runtime.trainer_cpus, "num_gpus": gpus, "scheduling_strategy": on_bundle(r)},
                recovery, name=self._name(r), copy_args=True,
            )
            for r in range(self.world)
        ]
        # Every rank joined (the constructors meet in the rendezvous), or the first failure.
        ray.get([h.actor.__ray_ready__.remote() for h in ranks])
        return list(ranks)

    # -- what the recipe calls -----------------------------------------------------
    # Every rank gets the same call at once (they meet in collectives) and answers identically:
    # the driver keeps rank 0's answer.
    def step(self, groups: list[Group]) -> dict[str, float]:
        metrics, self.version = call_all(self.ranks, TrainerRank.step, groups)[0]
        return metrics

    def weights(self) -> dict[str, torch.Tensor]:
        """Full weights gathered from the shards, on CPU (rank 0's answer)."""
        full = call_all(self.ranks, TrainerRank.weights)[0]
        if self.model is not None:
            self.model.load_state_dict(full)
        return full

    def state_dict(self) -> dict:
        return call_all(self.ranks, TrainerRank.state_dict)[0]

    def load_state_dict(self, state: dict, folder: Path | None = None) -> None:
        call_all(self.ranks, TrainerRank.load_state_dict, state, folder)
        self.version = int(state["version"])

    def save(self, folder: Path) -> None:
        """Every rank writes its shard of weights and optimizer state under `folder` (DCP)."""
        call_all(self.ranks, TrainerRank.save, folder)

    def close(self) -> None:
        for r in self.ranks:
            try:
                r.call(TrainerRank.close)
            except (ActorDiedError, RemoteCallError):  # a dead rank has nothing left to close
                pass
            r.close()
        if self.kind == "ray":
            import ray

            ray.util.remove_placement_group(self.pg)
