"""Smoke run of benchmarks/sandbox_load.py --quick: every number is produced, no exec fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sandbox.conftest import needs_bwrap

ROOT = Path(__file__).resolve().parents[2]


@needs_bwrap
def test_quick_benchmark_runs(tmp_path):
    out = tmp_path / "load.json"
    doc = tmp_path / "doc.md"
    doc.write_text("# prose\n<!-- sandbox-load-table-start -->\nSTALE-TABLE\n<!-- sandbox-load-table-end -->\nmore prose\n")
    r = subprocess.run([sys.executable, "benchmarks/sandbox_load.py", "--quick", "--out", str(out), "--doc", str(doc)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    for key in ("cold_start", "warm_acquire_pool", "warm_acquire_http", "exec_load"):
        assert res[key]["n"] > 0 and 0 < res[key]["p50_ms"] <= res[key]["p99_ms"] <= res[key]["max_ms"]
    assert res["exec_load"]["errors"] == 0 and res["exec_load"]["n"] == 100
    if os.geteuid() == 0:  # forks, copies and snapshots of a workspace: root only
        assert all(res[f"workspace_{k}"]["n"] == 4 for k in ("fork", "copy", "snapshot"))
    assert "| cold start (sandbox ready to run Python) |" in r.stdout
    text = doc.read_text()
    assert "STALE-TABLE" not in text and "| exec over HTTP, 20 calls/s for 5 s | 100 |" in text and text.endswith("more prose\n")


def test_docs_table_is_the_results_file():
    """docs/sandbox.md shows exactly the numbers in docs/results/sandbox_load.json."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import sandbox_load
    finally:
        sys.path.pop(0)
    res = json.loads((ROOT / "docs/results/sandbox_load.json").read_text())
    assert sandbox_load.render_table(res) in (ROOT / "docs/sandbox.md").read_text()
    assert res["exec_load"]["n"] == 6000 and res["exec_load"]["errors"] == 0
    for other in ("sandbox_load_busy.json", "sandbox_load_rerun.json"):
        busy = json.loads((ROOT / "docs/results" / other).read_text())
        assert sandbox_load.render_table(busy) in (ROOT / "docs/sandbox.md").read_text()
    faults = json.loads((ROOT / "docs/results/sandbox_faults.json").read_text())
    doc = " ".join((ROOT / "docs/sandbox.md").read_text().split())
    assert faults["mode"] == "rollout" and faults["lost"] == 0 and faults["completed"] == faults["episodes"] == 200
    assert not faults["faults_unaccounted"] and not faults["replacements_without_a_known_cause"]
    assert (f"{faults['completed']}/{faults['episodes']} episodes completed, **0 lost**, "
            f"{faults['retried_episodes_attempts']} retried episodes") in doc
    assert f"{faults['faults_injected']['kill']} kills" in doc


@needs_bwrap
@pytest.mark.slow  # about a minute: 24 episodes of the agentic rollout under kills, hangs, slowdowns, a restart
def test_quick_fault_injection_through_the_rollout_loses_no_episode(tmp_path):
    out = tmp_path / "faults.json"
    r = subprocess.run([sys.executable, "benchmarks/sandbox_faults.py", "--mode", "rollout", "--quick", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert out.exists(), r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert r.returncode == 0, res
    assert res["completed"] == res["episodes"] == 24 and res["lost"] == 0 and res["rewards_not_1"] == 0, res
    assert res["faults_injected"]["service restart"] == 1 and res["faults_injected"].get("kill", 0) > 0, res
    assert res["retried_episodes_attempts"] > 0, res  # the faults did cost episodes, which were retried
    assert res["deaths_in_event_log_by_cause"].get("service restarted", 0) > 0, res
    assert not res["faults_unaccounted"] and res["replacements_in_event_log"] > 0, res
    assert res["leftover_leases"] == [] and res["orphan_sandboxes_after"] == [], res
