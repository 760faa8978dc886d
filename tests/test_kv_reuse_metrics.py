"""The embedded engine's KV reuse between turns (rollout.engine.keep_kv_between_turns) shows in a
run's per-step metrics."""

from __future__ import annotations

import pytest

from cadence.config import load_config
from cadence.inference.prefix_reuse import reuse_metrics
from cadence.observe.metrics import read_jsonl
from cadence.recipes.train_rlvr import train
from tests.quick_run import QUICK_RUN

# Parity: two turns an episode, so every second turn can continue the first one's context.
AGENT = [
    *QUICK_RUN, "env.name=python:tests/agentic_envs.py:Parity", "env.action_tag=null", "env.max_turns=2",
    "rollout.max_new_tokens=3", "trainer.steps=2", "rollout.async_ratio=1",
]


def test_reuse_metrics_from_embedded_and_vllm_counters():
    embedded = {"prompt_tokens": 100, "prefill_tokens": 40, "reused_tokens": 60, "reuse_hits": 3, "reuse_misses": 4}
    assert reuse_metrics(embedded) == {
        "rollout/prompt_tokens_total": 100.0,
        "rollout/prefill_tokens_total": 40.0,
        "rollout/prefill_tokens_saved_total": 60.0,
        "rollout/prefill_tokens_saved_fraction": 0.6,
        "rollout/kv_reuse_hits_total": 3.0,
        "rollout/kv_reuse_misses_total": 4.0,
    }
    vllm = reuse_metrics({"prompt_tokens": 50, "cached_prompt_tokens": 32})
    assert vllm["rollout/prefill_tokens_total"] == 18.0 and vllm["rollout/prefill_tokens_saved_fraction"] == 0.64
    assert reuse_metrics({"prompt_tokens": 50, "busy_s": 1.0}) == {}  # the mock engine counts no reuse


@pytest.mark.parametrize("keep", [True, False])
def test_an_agentic_run_logs_the_prefill_its_kept_kv_saved(keep, tmp_path):
    cfg = load_config(None, [*AGENT, f"rollout.engine.keep_kv_between_turns={keep}", f"logging.run_dir={tmp_path}/run"])
    summary = train(cfg)
    steps = read_jsonl(summary.run_dir / "metrics.jsonl")
    assert [r["step"] for r in steps] == [1, 2]
    last = steps[-1]
    assert last["rollout/prompt_tokens_total"] > 0
    if keep:  # second turns continued their first turn's context: fewer tokens prefilled than prompted
        assert last["rollout/kv_reuse_hits_total"] > 0
        assert last["rollout/prefill_tokens_saved_total"] > 0
        assert 0 < last["rollout/prefill_tokens_saved_fraction"] < 1
        assert last["rollout/prefill_tokens_total"] < last["rollout/prompt_tokens_total"]
    else:
        assert last["rollout/kv_reuse_hits_total"] == 0 and last["rollout/prefill_tokens_saved_total"] == 0
        assert last["rollout/prefill_tokens_total"] == last["rollout/prompt_tokens_total"]
