"""benchmarks/async_throughput.py and async_parity.py: their tables, from fake results."""

from __future__ import annotations

import pytest

from tests.benchmark_module import load_benchmark


def _row(variant: str, samples_per_s: float, beta: float | None = None) -> dict:
    return {
        "variant": variant, "samples_per_s": samples_per_s, "tokens_per_s": 40 * samples_per_s,
        "step_seconds": 128 / samples_per_s, "train_seconds": 1.0, "engine_busy_fraction": 0.5,
        "trainer_idle_s": 0.1, "staleness_max": 2, "interrupted_fraction": 0.25, "beta_star": beta,
        "mu_gen_s": 0.01 if beta else None, "l_gen_s": 1.5 if beta else None, "mu_train_s": 0.008 if beta else None,
    }


def test_throughput_table_reports_ratios_to_both_syncs(tmp_path, monkeypatch):
    bench = load_benchmark("async_throughput")
    doc = tmp_path / "async.md"
    doc.write_text("intro\n<!-- async-table-start -->\nold\n<!-- async-table-end -->\noutro\n")
    monkeypatch.setattr(bench, "DOC", doc)
    rows = [_row("sync (inline, 2 threads)", 20.0), _row("sync (ray, 1+1 cores)", 40.0, beta=0.3),
            _row("async alpha=2", 80.0)]
    gen = [{"engine": e, "mode": m, "seconds": s} for e in ("embedded", "mock")
           for m, s in zip(bench.GENERATION_MODES, (4.0, 2.0, 1.0), strict=True)]
    bench.write_doc(rows, gen)
    text = doc.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "old" not in text
    line = next(x for x in text.splitlines() if x.startswith("| async alpha=2 |"))
    assert "| 4.00x | 2.00x |" in line  # x sync (inline), x best sync
    assert "| queue scheduling + prompt replication | embedded (CPU, 1 thread) | 1.00 | 4.00x |" in text
    assert "beta* = " in text


def test_parity_summary_and_table(tmp_path, monkeypatch):
    bench = load_benchmark("async_parity")
    runs = [
        {"mode": m, "seed": s, "before": 0.6, "after": a, "train_seconds": 50.0, "staleness_mean": st}
        for m, st, afters in (("sync (alpha=0)", 0.0, (1.0, 0.98, 0.99)), ("async (alpha=2)", 1.5, (0.97, 0.99, 0.98)))
        for s, a in enumerate(afters)
    ]
    summary = bench.summarise(runs)
    assert summary[0]["after_mean"] == pytest.approx(0.99) and summary[1]["after_mean"] == pytest.approx(0.98)
    doc = tmp_path / "async.md"
    doc.write_text("# async\n")
    monkeypatch.setattr(bench, "DOC", doc)
    bench.write_doc(summary, steps=100, seeds=[0, 1, 2])
    text = doc.read_text()
    assert "| async (alpha=2) | 0.600 | 0.980 ± 0.010 | 0.970, 0.990, 0.980 | -1.0 points | 1.50 | 50 |" in text
