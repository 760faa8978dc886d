"""A dead service's sandbox processes left under init are killed when the next pool starts."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from cadence.sandbox.isolation import UID_RANGE, reap_orphans

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sandbox uids exist only when the host runs as root")


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_an_orphan_of_a_sandbox_uid_is_killed_and_a_process_with_a_parent_is_not():
    uid = UID_RANGE[0] + 2 * 4321
    # The shell exits at once, so its background sleep is reparented to init: what bwrap's stuck
    # child looks like after its outer process was killed with its service.
    orphan = int(subprocess.run(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], user=uid, group=uid,
                                capture_output=True, text=True, check=True).stdout)
    parented = subprocess.Popen(["sleep", "300"], user=uid, group=uid)  # a live sandbox: its parent is here
    try:
        deadline = time.monotonic() + 5
        while _ppid(orphan) != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _ppid(orphan) == 1, "the test needs the orphan reparented to init (is a subreaper above us?)"
        assert reap_orphans() >= 1
        deadline = time.monotonic() + 5
        while _alive(orphan) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(orphan)
        assert parented.poll() is None  # not an orphan: left alone
    finally:
        parented.kill()
        parented.wait()
        if _alive(orphan):
            os.kill(orphan, 9)
