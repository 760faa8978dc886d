"""runtime.address=ray://...: a run trains through Ray Client against a head started with its
client server (a separate raylet and GCS on this machine), as on a remote cluster."""

from __future__ import annotations

import json
import socket

import pytest

from cadence.config import load_config
from cadence.recipes.train_rlvr import train
from tests.quick_run import QUICK_RUN


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_run_trains_through_ray_client(tmp_path):
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    port = _free_port()
    head = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": False, "ray_client_server_port": port})
    run = tmp_path / "run"
    cfg = load_config(None, [*QUICK_RUN, "trainer.steps=2", "checkpoint.every=0", "runtime.kind=ray",
                             f"runtime.address=ray://127.0.0.1:{port}", "runtime.rollout_cpus=1", "runtime.threads=1",
                             "logging.events=false", f"logging.run_dir={run}"])
    try:
        train(cfg)
        assert ray.util.client.ray.is_connected()  # the run went through the client, not a local Ray
    finally:
        ray.shutdown()
        head.shutdown()
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    assert all(s["rollout/samples"] > 0 for s in steps) if "rollout/samples" in steps[0] else True
