"""A leased sandbox released while the pool starts its replacement: the replacement is stopped,
not left running with no slot to reach it (the agent fault benchmark found 4 such bwrap
processes, and their cgroups, after 48 runs)."""

from __future__ import annotations

import os
import signal
import threading

from cadence.sandbox.pool import Pool, PoolConfig
from tests.sandbox.conftest import needs_bwrap

pytestmark = needs_bwrap


def test_a_release_while_the_replacement_starts_stops_the_replacement():
    pool = Pool(PoolConfig(warm=0, max_size=2, health_period_s=3600))
    started, release_done = [], threading.Event()
    start_box = pool._start_box

    def start_after_the_release(*args, **kw):
        release_done.wait(30)
        box = start_box(*args, **kw)
        started.append(box)
        return box

    try:
        sandbox_id = pool.acquire().id
        os.killpg(pool.box(sandbox_id).proc.pid, signal.SIGKILL)
        pool._start_box = start_after_the_release
        health = threading.Thread(target=pool.check)  # sees it dead, starts a replacement
        health.start()
        while not started and pool.get(sandbox_id).state != "starting":
            threading.Event().wait(0.01)
        pool.release(sandbox_id, "agent run ended")
        release_done.set()
        health.join(30)
        assert len(started) == 1 and not started[0].alive
        assert pool.list() == []
    finally:
        release_done.set()
        pool.close()
    for box in started:
        box.stop()
