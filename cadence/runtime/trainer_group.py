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

`TrainerGroup` offers the recipe what a `PolicyTrainer` does: `step`,
`version`, `weights`, `state_dict`, `load_state_dict`, plus `save_sharded`.
"""

from __future__ import annotations

import copy
import pickle
import socket
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cadence.rollout.sample import Group
from cadence.runtime.cluster import rank_gpus
from cadence.runtime.config import RuntimeConfig
from cadence.runtime.connect import connect_ray
from cadence.train.config import TrainerConfig
from cadence.train.data_parallel import DataParallel
from cadence.train.device import rank_device

# Builds one rank's trainer; must pickle (a module-level function or a functools.partial of one).
Build = Callable[[DataParallel], Any]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class TrainerRank:
    """One rank: joins the group, builds its trainer, runs the driver's calls on it."""

    def __init__(
        self, rank: int, world: int, build: Build, strategy: str, cpu_offload: bool, threads: int, device: str
    ) -> None:
        self.rank, self.world = rank, world
        self.build, self.strategy, self.cpu_offload, self.threads = build, strategy, cpu_offload, threads
        self.device = device  # trainer.device, resolved in the rank's process (the GPUs it sees)
        self.trainer: Any = None

    def address(self) -> str:
        """tcp://ip:port for the group's rendezvous (asked of rank 0; its node's address)."""
        import ray

        ip = ray.util.get_node_ip_address()
        return f"tcp://{ip}:{free_port(ip)}"

    def join(self, init_method: str) -> None:
        import torch.distributed as dist

        torch.set_num_threads(self.threads)
        device = rank_device(self.device, self.rank)
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=init_method, rank=self.rank, world_size=self.world)
        self.trainer = self.build(DataParallel(self.rank, self.world, self.strategy, self.cpu_offload, device))

    def call(self, method: str, *args: Any) -> Any:
        # Ray may hand over tensors backed by its shared object store; a rank owns its copies.
        return getattr(self.trainer, method)(*copy.deepcopy(args))

    def get(self, name: str) -> Any:
        return getattr(self.trainer, name)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def send(conn: Any, obj: Any) -> None:
    """Plain pickle, so tensors are copied: torch.multiprocessing's own pickling would put them in
    memory shared by every process they reach (two ranks updating one optimizer state)."""
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def receive(conn: Any) -> Any:
    return pickle.loads(conn.recv_bytes())


def _serve(conn: Any, rank: TrainerRank, init_method: str) -> None:
    """A spawned rank's main loop: (method, args) in, ("ok", result) or ("error", text) out."""
    try:
        rank.join(init_method)
        send(conn, ("ok", None))
        while True:
            method, args = receive(conn)
            if method == "close":
                rank.close()
                send(conn, ("ok", None))
                return
            try:
                send(conn, ("ok", getattr(rank, method)(*args)))
            except Exception:
                send(conn, ("error", traceback.format_exc()))
    except (EOFError, KeyboardInterrupt):  # the driver went away
        rank.close()
    except Exception:
        send(conn, ("error", traceback.format_exc()))


class TrainerRankError(RuntimeError):
    """A trainer rank failed; the message carries its traceback."""


def _failed(ref: Any) -> bool:
    """Whether a finished Ray call raised (a dead rank's); one still running counts as alive."""
    import ray

    ready, _ = ray.wait([ref], timeout=0)
    if not ready:
        return False
    try:
        ray.get(ready[0])
        return False
    except ray.exceptions.RayError:
        return True


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
        ranks = [
            TrainerRank(r, self.world, build, trainer_cfg.strategy, trainer_cfg.cpu_offload, threads, trainer_cfg.device)
            for r in range(self.world)
        ]
        if self.kind == "ray":
            self._start_ray(ranks, runtime, rank_gpus(runtime, trainer_cfg.device))
        else:  # one GPU per inline rank: checked when the config loads (check_runtime)
            self._start_processes(ranks)
        self.version = 0

    # -- starting the ranks ------------------------------------------------------
    def _start_processes(self, ranks: list[TrainerRank]) -> None:
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        init = f"tcp://127.0.0.1:{free_port()}"
        self.conns, self.procs = [], []
        for rank in ranks:
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(theirs, rank, init), daemon=True)
            proc.start()
            self.conns.append(ours)
            self.procs.append(proc)
        self._answers()  # every rank joined (or the first failure is raised)

    def _start_ray(self, ranks: list[TrainerRank], runtime: RuntimeConfig, gpus: float) -> None:
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
        actor = ray.remote(TrainerRank)
        self.actors = [
            actor.options(
                num_cpus=runtime.trainer_cpus,
                num_gpus=gpus,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i),
            ).remote(rank.rank, rank.world, rank.build, rank.strategy, rank.cpu_offload, rank.threads, rank.device)
            for i, rank in enumerate(ranks)
        ]
        init = ray.get(self.actors[0].address.remote())
        ray.get([a.join.remote(init) for a in self.actors])

    # -- calling every rank ------------------------------------------------------
    def _answers(self) -> list[Any]:
        replies = []
        for rank, conn in enumerate(self.conns):
            try:
                replies.append(receive(conn))
            except (EOFError, ConnectionError) as err:  # the rank's process died (kill -9, OOM)
                raise self._died(rank) from err
        failures = [text for status, text in replies if status == "error"]
        if failures:
            raise TrainerRankError(f"a trainer rank failed:\n{failures[0]}")
        return [result for _, result in replies]

    def _all(self, method: str, *args: Any) -> list[Any]:
        """`method(*args)` on every rank at once (they meet in collectives); their answers."""
        if self.kind == "ray":
            import ray

            refs = [getattr(a, method).remote(*args) for a in self.actors]
            try:
                return ray.get(refs)
            except ray.exceptions.RayActorError as err:
                # A rank's process or node died: the group's collectives cannot go on without it.
                dead = [i for i, r in enumerate(refs) if _failed(r)]
                raise TrainerRankError(
                    f"trainer rank(s) {dead or '?'} of {self.world} died during {method}: the step failed; "
                    f"resume from the last checkpoint (cadence train --resume, or runtime.max_restarts > 0): "
                    f"{str(err).splitlines()[0]}"
                ) from err
        for rank, conn in enumerate(self.conns):
            try:
                send(conn, (method, args))
            except OSError as err:  # BrokenPipeError: the rank's process is gone
                raise self._died(rank) from err
        return self._answers()

    def _died(self, rank: int) -> TrainerRankError:
        self.procs[rank].join(timeout=1)
        return TrainerRankError(
            f"trainer rank {rank} of {self.world} died (exit code {self.procs[rank].exitcode}): the step "
            "failed; resume from the last checkpoint (cadence train --resume, or runtime.max_restarts > 0)"
        )

    # -- what the recipe calls -----------------------------------------------------
    def step(self, groups: list[Group]) -> dict[str, float]:
        metrics = self._all("call", "step", groups)[0]
        self.version = self._all("get", "version")[0]
        return metrics

    def weights(self) -> dict[str, torch.Tensor]:
        """Full weights gathered from the shards, on CPU (rank 0's answer)."""
        full = self._all("call", "weights")[0]
        if self.model is not None:
            self.model.load_state_dict(full)
        return full

    def state_dict(self) -> dict:
        return self._all("call", "state_dict")[0]

    def load_state_dict(self, state: dict, folder: Path | None = None) -> None:
        self._all("call", "load_state_dict", state, folder)
        self.version = int(state["version"])

    def save_sharded(self, folder: Path) -> None:
        """Every rank writes its shard of weights and optimizer state under `folder` (DCP)."""
        self._all("call", "save_sharded", folder)

    def close(self) -> None:
        if self.kind == "ray":
            import ray

            for a in self.actors:
                ray.kill(a)
            ray.util.remove_placement_group(self.pg)
            return
        for conn, proc in zip(self.conns, self.procs, strict=True):
            try:
                send(conn, ("close", ()))
                receive(conn)
            except (BrokenPipeError, EOFError, OSError):
                pass
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
