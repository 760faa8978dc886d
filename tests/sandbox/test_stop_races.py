"""Sandboxes stopped while the host works on them (found by benchmarks/task_sandbox_faults.py):
a leased sandbox released while the pool starts its replacement has the replacement stopped, not
left running with no slot to reach it (4 such bwrap processes, and their cgroups, after 48 runs);
a workspace read of a sandbox stopped from another thread is a SandboxError (it was an
AttributeError, which lost the agent run without counting it: 8 of 64 runs), and so is a call
whose sandbox is stopped between its request and its reply (an AttributeError reached the agent,
and the pool, which replaces a sandbox on SandboxDied, kept the dead one leased)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from cadence.sandbox import LocalSandbox, workspace
from cadence.sandbox.models import SandboxDied, SandboxError
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
        proc = pool.box(sandbox_id).proc
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        pool._start_box = start_after_the_release
        health = threading.Thread(target=pool.check)  # sees it dead, starts a replacement
        health.start()
        deadline = time.monotonic() + 30
        while pool.get(sandbox_id).state != "starting":
            assert time.monotonic() < deadline, pool.get(sandbox_id)
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


def test_a_snapshot_of_a_sandbox_stopped_meanwhile_is_a_sandbox_error():
    box = LocalSandbox().start()
    box.stop()  # as a reaper or a replacement does, from another thread
    with pytest.raises(SandboxError, match="not running"):
        workspace.snapshot(box)


def test_a_reply_read_after_the_sandbox_was_stopped_is_sandbox_died():
    box = LocalSandbox().start()
    box.stop()  # between a call's request and its reply (the window is a few microseconds wide)
    with pytest.raises(SandboxDied, match="stopped during the call"):
        box._recv(time.monotonic() + 1.0)
