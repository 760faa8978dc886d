"""benchmarks/env_async.py: its ratio tables from fake results, and a --quick smoke run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.benchmark_module import BENCHMARKS, load_benchmark

SCRIPT = BENCHMARKS / "env_async.py"


def _row(engine: str, variant: str, alpha: int, per_s: float) -> dict:
    return {
        "engine": engine, "variant": variant, "alpha": alpha, "episodes_per_s": per_s,
        "engine_busy_fraction": 0.25, "step_seconds": 32 / per_s, "step_seconds_each": [30 / per_s, 34 / per_s],
        "train_seconds": 7.0, "trainer_idle_s": 1.0,
        "episodes_lost_timeout": 1.0, "episodes_cancelled": 3.0, "episodes_played": 40.0,
    }


def test_the_table_gives_ratios_to_lockstep_and_to_async_per_engine(tmp_path, monkeypatch):
    bench = load_benchmark("env_async")
    rows = [
        _row("embedded", "lock-step sync", 0, 0.5), _row("embedded", "env-level async", 0, 1.5),
        _row("embedded", "async + redundancy", 2, 2.0),
        _row("mock", "lock-step sync", 0, 1.0), _row("mock", "env-level async", 0, 4.0),
    ]
    sweep = [_row("mock", "more groups: extra_groups=2", 0, 5.0)]
    meta = {"date": "2026-01-01", "machine": "cpu", "loadavg_before": [3.0], "loadavg_after": [4.0],
            "steps": 5, "warmup": 1, "batch_episodes": 32, "command": bench.COMMAND,
            "settings": {"common": bench.COMMON, "quick": ["env.step_timeout_s=7"]}}
    table = bench.markdown({"meta": meta, "rows": rows, "sweep": sweep})
    line = next(x for x in table.splitlines() if x.startswith("| embedded | async + redundancy | 2 |"))
    assert "| 2.00 | 4.00x | 1.33x | 25% | 16.0 (15-17) | 7.0 |" in line  # x lock-step, x async (alpha 0, same engine)
    assert "| mock | env-level async | 0 | 4.00 | 4.00x | 1.00x |" in table
    assert "| mock | more groups: extra_groups=2 | 5.00 | 1.25x |" in table
    assert "load average 3.0 before, 4.0 after" in table
    assert f"{bench.MAX_TURNS} turns each" in table and "(7 s step timeout)" in table  # the runs' settings

    doc = tmp_path / "agentic.md"
    doc.write_text("intro\n<!-- env-async-table-start -->\nold\n<!-- env-async-table-end -->\noutro\n")
    monkeypatch.setattr(bench, "DOC", doc)
    bench.write_doc(table)
    text = doc.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "old" not in text


def test_timed_steps_leave_out_the_warmup():
    harness = load_benchmark("harness")
    records = [{"time/step": t, "progress/samples_total": 32.0 * (i + 1)} for i, t in enumerate([9.0, 2.0, 3.0])]
    timed, seconds, samples = harness.timed_steps(records, warmup=1)
    assert timed == records[1:] and seconds == 5.0 and samples == 64.0
    assert harness.timed_steps(records, warmup=0)[1:] == (14.0, 96.0)


@pytest.mark.slow
def test_quick_run_measures_every_variant_and_leaves_docs_alone(tmp_path):
    bench = load_benchmark("env_async")
    mine = [bench.DOC, bench.RESULTS]  # what a full run writes
    stamps = lambda: {p: p.stat().st_mtime_ns for p in mine if p.exists()}  # noqa: E731
    before = stamps()
    out = tmp_path / "env_async.json"
    subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(out)], check=True, timeout=300)
    result = json.loads(out.read_text())
    got = {(r["variant"], r["alpha"]) for r in result["rows"]}
    assert got == {(v, a) for v in bench.VARIANTS for a in bench.ALPHAS}
    for r in result["rows"] + result["sweep"]:
        assert r["episodes_per_s"] > 0 and 0 < r["engine_busy_fraction"] <= 1.5
        assert r["episodes"] == r["steps_timed"] * r["batch_episodes"]
        assert r["staleness_max"] <= r["alpha"]
    assert result["sweep"] == [] and result["meta"]["loadavg_before"]
    assert stamps() == before, "--quick wrote under docs/"
