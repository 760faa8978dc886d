"""Can the Ray cluster hold the run? Each role's resource request against the nodes.

A run on a cluster asks for actors by role:
  rollout   runtime.rollout_workers  x {CPU: rollout_cpus, GPU: rollout_gpus, **rollout_resources}
  trainer   runtime.trainer_workers  x {CPU: trainer_cpus, GPU: trainer_gpus, **trainer_resources}
            (only when trainer_workers > 1; one trainer runs in the driver process;
            trainer_gpus=0 with trainer.device=cuda asks 1 GPU per rank)
  critic    1 x {CPU: critic_cpus, **critic_resources}   (runtime.critic_actor)
  credit    1 x {CPU: credit_cpus, **critic_resources}   (runtime.credit_actor)
Custom resources pin roles to nodes: start a node with
`ray start --address=HEAD --resources='{"rollout_node": 4}'` and set
`runtime.rollout_resources={rollout_node: 1}`.

`check_fit` packs every actor onto the alive nodes' totals (largest request
first, first node with room) before any actor starts, and raises one line
naming the first role that does not fit, what it asked and what the cluster
has. Ray itself would leave such an actor pending forever. `wait_ready` is the
second line of defence (resources taken by someone else): an actor that does
not start within `placement_timeout_s` stops the run with the same kind of line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cadence.runtime.config import RuntimeConfig
from cadence.train.device import wants_cuda
from cadence.yaml_config import ConfigError


@dataclass
class RoleRequest:
    role: str  # what the user recognises: "rollout", "trainer", "critic", "credit"
    count: int
    each: dict[str, float]  # Ray resources per actor
    fields: str  # the config fields to change when it does not fit

    def describe(self) -> str:
        return f"{self.count} x {_fmt(self.each)}"


def rank_gpus(rt: RuntimeConfig, device: str) -> float:
    """GPUs per data-parallel trainer rank: `runtime.trainer_gpus`, else 1 for a CUDA trainer
    (NCCL needs a GPU of its own per rank) and 0 for a CPU one."""
    return rt.trainer_gpus or (1.0 if wants_cuda(device) else 0.0)


def role_requests(rt: RuntimeConfig, trainer_device: str = "cpu") -> list[RoleRequest]:
    """What a `runtime.kind=ray` run asks of the cluster, role by role (`trainer_device`:
    `trainer.device`, which sets the GPUs of a trainer rank)."""
    def res(cpus: float, gpus: float, custom: dict[str, float]) -> dict[str, float]:
        return {"CPU": cpus, **({"GPU": gpus} if gpus else {}), **custom}

    roles = [
        RoleRequest("rollout", rt.rollout_workers, res(rt.rollout_cpus, rt.rollout_gpus, rt.rollout_resources),
                    "runtime.rollout_workers/rollout_cpus/rollout_gpus/rollout_resources"),
    ]
    if rt.trainer_workers > 1:
        roles.append(RoleRequest("trainer", rt.trainer_workers,
                                 res(rt.trainer_cpus, rank_gpus(rt, trainer_device), rt.trainer_resources),
                                 "runtime.trainer_workers/trainer_cpus/trainer_gpus/trainer_resources"))
    if rt.critic_actor:
        roles.append(RoleRequest("critic", 1, res(rt.critic_cpus, 0, rt.critic_resources),
                                 "runtime.critic_cpus/critic_resources"))
    if rt.credit_actor:
        roles.append(RoleRequest("credit", 1, res(rt.credit_cpus, 0, rt.critic_resources),
                                 "runtime.credit_cpus/critic_resources"))
    return roles


def _fmt(resources: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) + "}"


def _fits(free: dict[str, float], ask: dict[str, float]) -> bool:
    return all(free.get(k, 0.0) >= v - 1e-9 for k, v in ask.items() if v > 0)


def pack(roles: list[RoleRequest], nodes: list[dict[str, float]]) -> RoleRequest | None:
    """First-fit-decreasing of every actor onto the nodes; the first role that does not fit, or None."""
    free = [dict(n) for n in nodes]
    actors = [(r, r.each) for r in roles for _ in range(r.count)]
    actors.sort(key=lambda a: (-sum(a[1].get(k, 0) for k in ("GPU",)), -a[1].get("CPU", 0)))
    for role, ask in actors:
        node = next((n for n in free if _fits(n, ask)), None)
        if node is None:
            return role
        for k, v in ask.items():
            node[k] = node.get(k, 0.0) - v
    return None


def alive_nodes() -> list[dict[str, float]]:
    """Total resources of each alive node (not what is free now: other runs come and go)."""
    import ray

    return [
        {k: float(v) for k, v in n["Resources"].items() if not k.startswith("node:") and k != "object_store_memory"
         and k != "memory"}
        for n in ray.nodes() if n.get("Alive")
    ]


def cluster_summary(nodes: list[dict[str, float]]) -> str:
    total: dict[str, float] = {}
    for n in nodes:
        for k, v in n.items():
            total[k] = total.get(k, 0.0) + v
    per_node = "; ".join(_fmt(n) for n in nodes)
    return f"{len(nodes)} node(s), {_fmt(total)} in all ({per_node})"


def check_fit(rt: RuntimeConfig, nodes: list[dict[str, float]] | None = None, trainer_device: str = "cpu") -> None:
    """Raise `ConfigError` (one line) when the roles of `rt` cannot all be placed on the cluster."""
    nodes = alive_nodes() if nodes is None else nodes
    roles = role_requests(rt, trainer_device)
    failed = pack(roles, nodes)
    if failed is not None:
        asked = ", ".join(f"{r.role} {r.describe()}" for r in roles)
        raise ConfigError(
            f"runtime: the Ray cluster cannot fit the {failed.role} role ({failed.describe()}); the run asks "
            f"{asked}; the cluster has {cluster_summary(nodes)}; lower {failed.fields} or add nodes"
        )


def wait_ready(actors: list[Any], role: str, each: dict[str, float], timeout_s: float) -> None:
    """Block until every actor of `role` has started; one-line error naming it after `timeout_s`."""
    import ray

    refs = [a.__ray_ready__.remote() for a in actors]
    ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if pending:
        for a in actors:
            ray.kill(a)
        raise ConfigError(
            f"runtime: {len(pending)} of {len(actors)} {role} actor(s) ({_fmt(each)} each) did not start within "
            f"runtime.placement_timeout_s={timeout_s:g}; the cluster has {cluster_summary(alive_nodes())} "
            "(other jobs may hold part of it)"
        )
    ray.get(ready)  # an actor whose constructor raised: its error, now
