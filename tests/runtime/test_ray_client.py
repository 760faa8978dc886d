"""runtime.address=ray://...: a run trains through Ray Client against a head started with its
client server (a separate raylet and GCS on this machine), as on a remote cluster."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from cadence.config import load_config
from cadence.observe.metrics import read_jsonl
from cadence.recipes.train_rlvr import train
from tests.quick_run import QUICK_RUN


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _client_server_logs(head) -> str:
    """The last lines of every ray_client_server* log of the head."""
    logs = Path(head.head_node.get_logs_dir_path())
    return "\n".join(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-30:])
                     for f in sorted(logs.glob("ray_client_server*")))


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
        try:
            train(cfg)
        except RuntimeError as err:  # the head's client-server logs say why a server did not start
            raise AssertionError(f"{err}\n{_client_server_logs(head)}") from err
        assert ray.util.client.ray.is_connected()  # the run went through the client, not a local Ray
    finally:
        ray.shutdown()
        head.shutdown()
    steps = read_jsonl(run / "metrics.jsonl")
    assert [s["step"] for s in steps] == [1, 2]
    assert 0 < steps[0]["progress/samples_total"] < steps[1]["progress/samples_total"]  # each step trained samples
