"""benchmarks/multiturn_kv.py: a --quick smoke run (structure, not speed)."""

from __future__ import annotations

import json

import pytest

from tests.benchmark_module import load_benchmark


@pytest.mark.slow
def test_quick_run(tmp_path):
    bench = load_benchmark("multiturn_kv")
    doc_before = bench.DOC.read_text()
    report = bench.main(["--quick", "--workdir", str(tmp_path)])

    assert bench.DOC.read_text() == doc_before  # --quick leaves docs/ alone
    saved = json.loads((tmp_path / "multiturn_kv.json").read_text())
    assert saved == json.loads(json.dumps(report))
    turns = saved["meta"]["settings"]["turns"]
    assert [(r["model"], r["episodes"]) for r in saved["rows"]] == [("builtin", 2), ("qwen2", 2)]
    for row in saved["rows"]:
        assert row["outputs_equal"]  # greedy: reuse changes the cost, never the tokens
        prefill = row["prefill_tokens_per_episode"]
        assert prefill["reuse"] < prefill["no reuse"] == row["prompt_tokens_per_episode"]
        assert row["prefill_tokens_per_episode_ratio"] > 1
        for variant, runs in row["runs"].items():
            for run in runs:
                assert run["reuse_hits"] == (2 * (turns - 1) if variant == "reuse" else 0)
                assert len(run["turn_s_by_index"]) == turns and run["turn_s_mean"] > 0
    assert "| built-in | 2 |" in bench.table(saved["rows"], saved["meta"])
