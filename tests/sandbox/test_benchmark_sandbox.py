"""Smoke run of benchmarks/sandbox_load.py --quick: every number is produced, no exec fails."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.sandbox.conftest import needs_bwrap

pytestmark = needs_bwrap


def test_quick_benchmark_runs(tmp_path):
    out = tmp_path / "load.json"
    r = subprocess.run([sys.executable, "benchmarks/sandbox_load.py", "--quick", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    for key in ("cold_start", "warm_acquire_pool", "warm_acquire_http", "exec_load"):
        assert res[key]["n"] > 0 and 0 < res[key]["p50_ms"] <= res[key]["p99_ms"] <= res[key]["max_ms"]
    assert res["exec_load"]["errors"] == 0 and res["exec_load"]["n"] == 100
    assert "| cold start (sandbox ready to run Python) |" in r.stdout
