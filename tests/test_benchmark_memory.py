"""benchmarks/memory.py: each variant on a tiny Qwen2 in this process, and the report's targets."""

from __future__ import annotations

import argparse

import pytest

from tests.benchmark_module import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("memory")


def tiny_args(bench) -> argparse.Namespace:
    args = vars(bench.parser().parse_args([]))
    args.update(hidden=32, layers=2, heads=2, kv_heads=1, mlp=64, vocab=300, seq_len=16, batch=4, steps=2, lora_r=4)
    return argparse.Namespace(**args)


def test_variants_train_with_equal_starting_losses_and_lora_keeps_less_optimizer_state(bench):
    args = tiny_args(bench)
    results = {name: bench.run_variant(args, **variant) for name, variant in bench.VARIANTS.items()}
    losses = {round(r["loss"], 5) for r in results.values()}
    assert len(losses) == 1  # B = 0 and checkpointing: the same starting loss everywhere
    for kind in ("full", "lora"):  # checkpointing trains the same steps
        assert results[kind]["last_step_loss"] == pytest.approx(results[f"{kind} + checkpointing"]["last_step_loss"],
                                                                 abs=1e-5)
    full, lora = results["full"], results["lora"]
    assert lora["trainable_parameters"] < full["trainable_parameters"] == full["parameters"]
    # AdamW keeps two float32 moments per trained weight (and a step count per tensor).
    assert full["optimizer_mib"] * 2**20 >= 8 * full["trainable_parameters"]
    assert lora["optimizer_mib"] < full["optimizer_mib"] / 3
    lines = bench.report(results)
    assert lines[0].startswith("| variant |") and len(lines) == 2 + 4 + 3
    assert "LoRA optimizer state" in lines[6]
