"""The sandbox pool as a Ray actor, one per node, so rollout workers on every node share pools.

    handles = start_node_services(PoolConfig(warm=4))    # once, from the driver
    svc = local_service()                                 # in any worker: this node's actor
    sid = ray.get(svc.acquire.remote()).id
    out = ray.get(svc.exec.remote(sid, ExecRequest(code="print(1)")))

Actors are named `cadence-sandbox-<node id>` in the `cadence` namespace and pinned to their node
(sandboxes are processes of the node they run on); `get_if_exists` makes starting them twice
harmless. Calls run on the actor's threads (`max_concurrency`), like the HTTP service's.
"""

from __future__ import annotations

from cadence.sandbox.events import Event
from cadence.sandbox.models import ExecRequest, ExecResult, Limits
from cadence.sandbox.pool import Pool, PoolConfig, SandboxInfo

NAMESPACE = "cadence"


def actor_name(node_id: str) -> str:
    return f"cadence-sandbox-{node_id}"


class NodeSandboxService:
    """What the HTTP service offers, as actor methods (errors travel as the pool raised them)."""

    def __init__(self, config: PoolConfig) -> None:
        self.pool = Pool(config)

    def acquire(self, limits: Limits | None = None) -> SandboxInfo:
        return self.pool.acquire(limits)

    def exec(self, sandbox_id: str, request: ExecRequest) -> ExecResult:
        return self.pool.exec(sandbox_id, request)

    def write_file(self, sandbox_id: str, path: str, data: bytes, mode: int | None = None) -> str:
        return self.pool.write_file(sandbox_id, path, data, mode)

    def read_file(self, sandbox_id: str, path: str) -> bytes:
        return self.pool.read_file(sandbox_id, path)

    def release(self, sandbox_id: str) -> None:
        self.pool.release(sandbox_id)

    def status(self, sandbox_id: str) -> SandboxInfo:
        return self.pool.get(sandbox_id)

    def list(self) -> list[SandboxInfo]:
        return self.pool.list()

    def counts(self) -> dict[str, int]:
        return self.pool.counts()

    def events(self, sandbox_id: str | None = None, since_id: int = 0, limit: int = 1000) -> list[Event]:
        return self.pool.events.query(sandbox_id, since_id, limit)

    def shutdown(self) -> None:
        self.pool.close()


def start_node_services(config: PoolConfig | None = None, max_concurrency: int = 32) -> dict:
    """One NodeSandboxService per alive Ray node (node id -> actor handle)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    cls = ray.remote(NodeSandboxService)
    handles = {}
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        nid = node["NodeID"]
        handles[nid] = cls.options(
            name=actor_name(nid), namespace=NAMESPACE, get_if_exists=True, lifetime="detached",
            num_cpus=0, max_concurrency=max_concurrency,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=nid, soft=False),
        ).remote(config or PoolConfig())
    return handles


def local_service():
    """This node's sandbox actor (start_node_services must have run)."""
    import ray

    nid = ray.get_runtime_context().get_node_id()
    return ray.get_actor(actor_name(nid), namespace=NAMESPACE)


def stop_node_services() -> None:
    import ray

    for node in ray.nodes():
        try:
            actor = ray.get_actor(actor_name(node["NodeID"]), namespace=NAMESPACE)
        except ValueError:
            continue
        ray.get(actor.shutdown.remote())
        ray.kill(actor)
