"""The pool as a per-node Ray actor: workers on the node find it by name and share it."""

from __future__ import annotations

import pytest

from cadence.sandbox import ExecRequest, Limits
from cadence.sandbox.pool import PoolConfig
from tests.sandbox.conftest import needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.slow]  # starts a Ray cluster (tens of seconds on 2 cores)


def test_workers_share_the_node_pool():
    ray = pytest.importorskip("ray")
    from cadence.sandbox.ray_service import local_service, start_node_services, stop_node_services

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        handles = start_node_services(PoolConfig(warm=1, limits=Limits(wall_s=10)))
        assert len(handles) == 1
        # Starting again returns the same actors, not a second pool.
        again = start_node_services(PoolConfig(warm=1))
        assert list(again) == list(handles)

        @ray.remote(num_cpus=0)
        def worker(i: int) -> str:
            svc = local_service()
            sid = ray.get(svc.acquire.remote()).id
            ray.get(svc.write_file.remote(sid, "i.txt", str(i).encode()))
            out = ray.get(svc.exec.remote(sid, ExecRequest(code="print(int(open('i.txt').read()) ** 2)")))
            ray.get(svc.release.remote(sid))
            return out.stdout

        assert ray.get([worker.remote(i) for i in range(4)]) == ["0\n", "1\n", "4\n", "9\n"]
        svc = next(iter(handles.values()))
        acquired = [e for e in ray.get(svc.events.remote()) if e.state == "busy"]
        assert len(acquired) == 4
    finally:
        stop_node_services()
        ray.shutdown()
