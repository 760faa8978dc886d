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


def test_timeline_of_a_kept_run(tmp_path):
    """async_timeline.py reads one timed step: the trainer's split, the engine's shares and a group's delay."""
    import json

    timeline = load_benchmark("async_timeline")
    run = tmp_path / "run"
    (run / "events").mkdir(parents=True)
    metrics = [{"step": s, "time/step": 10.0, "train/seconds": 4.0, "rollout/engine_steps": 100.0 * s,
                "rollout/engine_busy_s": 6.0 * s, "rollout/samples_total": 150.0 * s, "train/staleness_mean": 1.0,
                "buffer/dropped_groups": 0.0} for s in (1, 2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    spans = [("waiting", 0, 5), ("training", 5, 9), ("weight_sync", 9, 9.5), ("logging", 9.5, 10)]
    trainer = [{"state": s, "t0": 10 * (step - 1) + a, "t1": 10 * (step - 1) + b, "step": step}
               for step in (1, 2) for s, a, b in spans]
    (run / "events" / "trainer.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trainer))
    (run / "events" / "rollout-0.jsonl").write_text(
        json.dumps({"state": "weight_sync", "t0": 9.5, "t1": 11.5}) + "\n"
        + json.dumps({"state": "generating", "t0": 11.5, "t1": 20}) + "\n")
    probe = [{"e": "swap", "t0": 9.5, "t1": 11.5, "cpu": 1.0, "version": 1},
             {"e": "add", "t": 11.5, "id": "7/0"},
             *({"e": "step", "t0": 12 + i, "t1": 12.5 + i, "cpu": 0.25, "running": 8, "waiting": 2,
                "done": ["7/0"] if i == 3 else []} for i in range(8)),
             {"e": "put", "t": 15.7, "group": 7, "version": 1}]
    (run / "events" / "groups-1.jsonl").write_text("".join(json.dumps(p) + "\n" for p in probe))
    row = timeline.per_run(run, warmup=1)
    assert row["trainer_wait_s"] == 5 and row["train_s"] == 4 and row["rollout_generating_s"] == 8.5
    assert row["engine_steps"] == 100 and row["samples_per_engine_step"] == 1.5
    assert row["engine_step_share"] == pytest.approx(0.4) and row["engine_rows_mean"] == 8
    assert row["answer_to_buffer_ms"] == pytest.approx(200.0)  # last answer at 15.5, in the buffer at 15.7
    assert row["engine_cpu_share"] == pytest.approx(0.5) and row["engine_cpu_ms_per_sample"] == pytest.approx(2000.0)
    # two swaps recomputed 4 and 6 rows of 2000 and 3000 tokens: 2.5 CPU s is 500 ms per 1k tokens
    swaps = timeline.swap_fields([{"cpu": 1.0, "rows": 4, "tokens": 2000}, {"cpu": 1.5, "rows": 6, "tokens": 3000}])
    assert swaps == {"swap_rows": 5, "swap_tokens": 2500, "swap_cpu_ms_per_1k_tokens": pytest.approx(500.0)}


def test_cycle_fields_split_each_swap_to_swap_cycle_into_queue_and_drain():
    cycle_fields = load_benchmark("async_timeline").cycle_fields

    def step(t0: float, running: int, waiting: int, cpu: float) -> dict:
        return {"t0": t0, "t1": t0 + 0.1, "running": running, "waiting": waiting, "cpu": cpu}

    swaps = [{"t0": 0.0, "t1": 0.5}, {"t0": 2.0, "t1": 2.2}, {"t0": 4.2, "t1": 4.3}]
    # cycle 1: queued until the step at 1.0, then 3 steps on the rows left until the swap at 2.0
    # cycle 2: queued until 3.2, then 2 steps; a step straddling a swap belongs to no cycle
    steps = [step(0.5, 60, 20, 0.03), step(1.0, 7, 0, 0.005), step(1.3, 5, 0, 0.007), step(1.6, 3, 0, 0.006),
             step(1.95, 2, 0, 0.006), step(2.2, 62, 9, 0.031), step(3.2, 4, 0, 0.009), step(3.5, 1, 0, 0.004)]
    fields = cycle_fields(steps, swaps)
    assert fields["queue_empty_s"] == pytest.approx(0.75)  # median of 0.5 and 1.0
    assert fields["drain_s"] == pytest.approx(1.0) and fields["drain_steps"] == 2.5  # (1.0, 1.0); (3, 2)
    assert fields["step_cpu_ms_under_8_rows"] == pytest.approx(6.0)  # median of 7, 5, 6, 6, 9, 4 ms
    assert fields["step_cpu_ms_56_to_63_rows"] == pytest.approx(30.5)
    gc = cycle_fields([{**r, "gc": g} for r, g in zip(steps, [0.004, 0, 0, 0, 0, 0.002, 0, 0], strict=True)], swaps)
    assert gc["step_gc_ms_mean"] == pytest.approx(0.75)  # 6 ms of collections over 8 steps
    assert cycle_fields(steps, swaps[:1]) == {"step_cpu_ms_under_8_rows": pytest.approx(6.0),
                                              "step_cpu_ms_56_to_63_rows": pytest.approx(30.5)}
