"""benchmarks/rhythm_credit.py: its task, its table writer, and a --quick smoke run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmark_module import load_benchmark

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "rhythm_credit.py"


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("rhythm_credit")


def test_scratchpad_working_and_slip(bench):
    assert bench.scratchpad(47, 38) == "7+8=15, 4+3+1=8, so 85\n"
    assert bench.scratchpad(47, 38, slip=True) == "7+8=15, 4+3+0=7, so 75\n"
    assert bench.scratchpad(5, 33) == "5+3=8, 0+3+0=3, so 38\n"
    assert bench.scratchpad(99, 99) == "9+9=18, 9+9+1=19, so 198\n"
    for a, b in [(0, 0), (12, 90), (55, 45), (99, 1)]:
        assert int(bench.scratchpad(a, b).split()[-1]) == a + b


def test_scratchpad_split_is_disjoint(bench):
    train, test = bench.scratchpad_split()
    assert len(test) == bench.SCRATCHPAD_TEST
    assert len(train) + len(test) == 10_000
    assert not set(train) & set(test)


def test_write_table_replaces_only_between_markers(bench, tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(f"intro\n{bench.TABLE_START}\nold table\n{bench.TABLE_END}\noutro\n")
    bench.write_table(doc, "| new |\n")
    bench.write_table(doc, "| newer |\n")  # a rerun replaces, never appends
    assert doc.read_text() == f"intro\n{bench.TABLE_START}\n| newer |\n{bench.TABLE_END}\noutro\n"


@pytest.mark.slow
def test_quick_run(bench, tmp_path):
    doc_before = bench.DOC.read_text() if bench.DOC.exists() else None
    report = bench.main(["--quick", "--workdir", str(tmp_path), "--methods", "none", "coupled"])

    assert bench.DOC.exists() is (doc_before is not None)
    if doc_before is not None:
        assert bench.DOC.read_text() == doc_before  # --quick leaves docs/ alone
    saved = json.loads((tmp_path / "rhythm_credit.json").read_text())
    assert saved["summary"] == json.loads(json.dumps(report["summary"]))
    rows = {(r["setting"], r["method"]): r for r in report["summary"]}
    assert set(rows) == {(s, m) for s in ("default", "scratchpad") for m in ("none", "coupled")}
    for (_, method), row in rows.items():
        assert row["seeds"] == [0]
        assert 0.0 <= row["pass_after_mean"] <= 1.0
        assert row["step_s"] > 0
        if method == "none":
            assert row["attention_s"] == 0 and row["gamma_mean"] is None
        else:
            assert 0 < row["attention_share"] < 1 and row["gamma_mean"] >= 1.0
    # Default responses are shorter than the FAI horizon: coupled credit is inert.
    default = rows[("default", "coupled")]
    assert default["gamma_mean"] == 1.0 and default["amplified_frac"] == 0.0
    assert default["identical_to_grpo"] is True
    assert {p["micro_batch"] for p in report["meta"]["attention_probe"]["default"]} == {16, 128}
