"""benchmarks/asyppo.py: the summary and acceptance logic, and a --quick smoke run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.benchmark_module import load_benchmark

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "asyppo.py"


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("asyppo")


def _run(method: str, seed: int, after: float, step: float, rss: float, params: int) -> dict:
    return {
        "method": method, "seed": seed, "pass_at_1_before": 0.6, "pass_at_1_after": after,
        "train_accuracy_last10": 0.9, "step_seconds": step, "trainer_seconds": step / 2,
        "trainer_idle_seconds": step / 2, "critic_seconds": step / 4 if params else None,
        "cpu_seconds": 10 * step, "peak_rss_mib": rss, "adv_masked_fraction": None,
        "critic_params": params, "policy_params": 1000,
    }


def _runs() -> list[dict]:
    # Seed 1 ran on a busier machine: every method is slower there.
    return [
        _run("grpo", 0, 1.0, 0.3, 600, 0), _run("ppo", 0, 0.99, 0.6, 640, 1000),
        _run("asyppo", 0, 1.0, 0.45, 620, 400),
        _run("grpo", 1, 0.99, 0.6, 602, 0), _run("ppo", 1, 1.0, 1.2, 636, 1000),
        _run("asyppo", 1, 0.99, 0.9, 618, 400),
    ]


def test_summary_pairs_seeds_and_checks_the_bars(bench):
    methods = bench.summarise(_runs())
    asy = methods["asyppo"]
    assert asy["step_time_vs_ppo"]["values"] == pytest.approx([0.75, 0.75])  # load cancels
    assert asy["rss_over_grpo_mib"]["values"] == pytest.approx([20, 16])
    assert asy["critic_params_vs_ppo"] == pytest.approx(0.4)
    assert asy["critic_state_mib"] == pytest.approx(16 * 400 / 2**20)
    # Equal mean accuracy (1.0 + 0.99 in both) passes despite float rounding.
    assert bench.acceptance(methods) == {
        "critic_params_at_most_half_of_ppo": True,
        "step_time_below_ppo": True,
        "peak_rss_below_ppo": True,
        "accuracy_not_below_ppo": True,
    }
    tables = bench.markdown_tables(methods, [0, 1])
    assert "| asyppo |" in tables and "0.400x" in tables


def test_tables_go_between_the_markers(bench, tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(f"intro\n{bench.TABLE_START}\nold\n{bench.TABLE_END}\noutro\n")
    bench.write_doc_table(doc, "| new |\n", "footer")
    text = doc.read_text()
    assert "old" not in text and "| new |" in text and text.endswith(f"{bench.TABLE_END}\noutro\n")


@pytest.mark.slow
def test_quick_run_writes_results(tmp_path):
    subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path)], check=True)
    report = json.loads((tmp_path / "results.json").read_text())
    assert set(report["methods"]) == {"grpo", "ppo", "asyppo"}
    assert report["methods"]["asyppo"]["critic_params"] <= 0.5 * report["methods"]["ppo"]["critic_params"]
    assert (tmp_path / "table.md").exists() and (tmp_path / "asyppo.png").exists()
