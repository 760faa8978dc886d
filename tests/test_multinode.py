"""Multi-node runs on a real Ray cluster on this machine: a head (the driver, which trains) and
worker nodes (separate raylets) carrying a custom resource that pins rollout to them; a
request the cluster cannot fit fails before training with one line; a rollout node killed
mid-run costs a restart of its actor elsewhere, and every step is logged exactly once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from cadence.config import ConfigError, load_config
from cadence.observe.metrics import read_jsonl
from cadence.runtime.cluster import RoleRequest, check_fit, pack, rank_gpus
from tests.quick_run import QUICK_RUN

QUICK = [*QUICK_RUN, "checkpoint.every=0", "rollout.async_ratio=1", "runtime.threads=1"]


def test_pack_names_the_role_that_does_not_fit():
    nodes = [{"CPU": 2.0}, {"CPU": 1.0, "rollout_node": 1.0}]
    fits = [RoleRequest("rollout", 1, {"CPU": 1.0, "rollout_node": 1.0}, "x"), RoleRequest("trainer", 2, {"CPU": 1.0}, "y")]
    assert pack(fits, nodes) is None
    too_many = [RoleRequest("rollout", 2, {"CPU": 0.5, "rollout_node": 1.0}, "x")]
    assert pack(too_many, nodes).role == "rollout"
    # 3 CPUs in all, but no node holds a 2.5-CPU actor: totals alone would say it fits.
    assert pack([RoleRequest("critic", 1, {"CPU": 2.5}, "z")], nodes).role == "critic"


def test_check_fit_error_is_one_line_with_role_ask_and_cluster():
    cfg = load_config(None, ["runtime.kind=ray", "runtime.rollout_workers=3", "runtime.rollout_resources={gpu_box: 1}"])
    with pytest.raises(ConfigError) as err:
        check_fit(cfg.runtime, [{"CPU": 4.0}, {"CPU": 2.0, "gpu_box": 2.0}])
    text = str(err.value)
    assert "\n" not in text
    assert "rollout role (3 x {CPU: 1, gpu_box: 1})" in text
    assert "2 node(s), {CPU: 6, gpu_box: 2} in all" in text
    assert "runtime.rollout_workers" in text


def test_a_cuda_trainer_asks_one_gpu_per_rank_unless_trainer_gpus_says():
    cfg = load_config(None, ["runtime.kind=ray", "runtime.trainer_workers=2"])
    gpu_node = [{"CPU": 8.0, "GPU": 1.0}]
    check_fit(cfg.runtime, gpu_node, trainer_device="cpu")  # a CPU trainer asks no GPU
    with pytest.raises(ConfigError, match=r"trainer role \(2 x \{CPU: 1, GPU: 1\}\)"):
        check_fit(cfg.runtime, gpu_node, trainer_device="cuda")  # NCCL: a GPU of its own per rank
    half = load_config(None, ["runtime.kind=ray", "runtime.trainer_workers=2", "runtime.trainer_gpus=0.5"])
    check_fit(half.runtime, gpu_node, trainer_device="cuda")
    assert rank_gpus(half.runtime, "cuda") == 0.5 and rank_gpus(cfg.runtime, "cpu") == 0.0


def _records(run: Path) -> list[dict]:
    """The run's metrics log so far: whole lines only, as the trainer may be writing one."""
    return read_jsonl(run / "metrics.jsonl")


@pytest.fixture(scope="module")
def cluster():
    """Head (1 CPU: the driver trains outside Ray) and two rollout nodes (raylets of their own)."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    # A dead node is noticed after ~1.5 s of failed health checks (default: 15 s).
    fast = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}
    c = Cluster(initialize_head=True,
                head_node_args={"num_cpus": 1, "include_dashboard": False, "_system_config": fast})
    try:
        for _ in range(2):
            c.add_node(num_cpus=1, resources={"rollout_node": 1})
        c.wait_for_nodes()
        ray.init(address=c.address, include_dashboard=False, logging_level="ERROR")
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def _actor_nodes(class_name: str) -> list[str]:
    import ray

    table = ray._private.state.actors()
    return [a["Address"]["NodeID"] for a in table.values() if a["ActorClassName"].endswith(class_name)
            and a["State"] == "ALIVE"]


@pytest.mark.slow
def test_critic_style_actor_is_pinned_by_its_custom_resource(cluster):
    import gc

    import ray
    from ray.runtime_context import RuntimeContext

    from cadence.runtime.actors import RayActor, Recovery

    pinned = {n.node_id for n in cluster.worker_nodes}  # the nodes started with rollout_node
    # The object the actor holds is its own runtime context: it says which node the actor is on.
    actor = RayActor(ray.get_runtime_context, {"num_cpus": 0.5, "resources": {"rollout_node": 0.5}}, Recovery("critic"))
    node = actor.call(RuntimeContext.get_node_id)
    assert node in pinned and node != ray.get_runtime_context().get_node_id()
    del actor
    gc.collect()  # the last handle gone: Ray ends the actor and frees its resources


@pytest.mark.slow
def test_unfittable_request_fails_before_training(cluster, tmp_path):
    from cadence.recipes.train_rlvr import train

    cfg = load_config(None, [*QUICK, "trainer.steps=2", "runtime.kind=ray", f"runtime.address={cluster.address}",
                             "runtime.rollout_workers=3", "runtime.rollout_resources={rollout_node: 1}",
                             f"logging.run_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="cannot fit the rollout role"):
        train(cfg)
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.slow
def test_rollout_node_killed_mid_run(cluster, tmp_path):  # last: it takes a node away
    import ray

    from cadence.recipes.train_rlvr import train

    steps = 8
    cfg = load_config(None, [*QUICK, f"trainer.steps={steps}", "runtime.kind=ray",
                             f"runtime.address={cluster.address}", "runtime.rollout_cpus=1",
                             "runtime.rollout_resources={rollout_node: 1}", f"logging.run_dir={tmp_path}"])
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["summary"] = train(cfg)
        except BaseException as err:  # noqa: BLE001 - reported by the test below
            outcome["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.time() + 180
    while time.time() < deadline and len(_records(tmp_path)) < 2:
        assert thread.is_alive(), outcome
        time.sleep(0.1)
    driver_node = ray.get_runtime_context().get_node_id()
    (rollout_node,) = _actor_nodes("RolloutWorker")
    assert rollout_node != driver_node  # trainer (driver, head) and rollout on different nodes
    victim = next(n for n in cluster.worker_nodes if n.node_id == rollout_node)
    killed_at = len(_records(tmp_path))
    cluster.remove_node(victim, allow_graceful=False)
    restarted_on = None
    while thread.is_alive() and restarted_on is None:
        restarted_on = next((n for n in _actor_nodes("RolloutWorker") if n != rollout_node), None)
        time.sleep(0.1)
    thread.join(timeout=240)
    assert "error" not in outcome, outcome.get("error")
    assert killed_at < steps, "the node died after the run ended: nothing was tested"
    assert [r["step"] for r in _records(tmp_path)] == list(range(1, steps + 1))
    assert restarted_on not in (None, rollout_node, driver_node)  # the other rollout node
