"""Sandbox fixtures: a started LocalSandbox that is always stopped."""

from __future__ import annotations

import shutil

import pytest

from cadence.sandbox import Limits, LocalSandbox

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None,
    reason="bubblewrap not installed (apt-get install bubblewrap; .ci/run installs it)",
)


@pytest.fixture
def box():
    with LocalSandbox(Limits(wall_s=10, cpu_s=5)) as sb:
        yield sb


@pytest.fixture
def small_box():
    """Tight limits, so the limit tests finish fast."""
    with LocalSandbox(Limits(memory_mb=256, processes=32, file_size_mb=1, disk_mb=8, cpu_s=1, wall_s=5)) as sb:
        yield sb
