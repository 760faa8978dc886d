"""Checkpoint layout/rotation and the metrics file's resume truncation."""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForCausalLM

from cadence.models.tiny import char_tokenizer, tiny_model
from cadence.observe.metrics import MetricsLogger, read_jsonl, truncate_jsonl
from cadence.rollout.evaluate import pass_at_k
from cadence.train.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_state,
    save_checkpoint,
)


def test_checkpoints_rotate_and_load_in_plain_transformers(tmp_path):
    model, tok = tiny_model(hidden_size=32, layers=1, heads=2), char_tokenizer()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model, tok, {"cursor": step}, keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3]
    step, path = latest_checkpoint(tmp_path)
    assert step == 3 and load_state(path)["cursor"] == 3
    loaded = AutoModelForCausalLM.from_pretrained(path)
    for a, b in zip(loaded.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_half_written_checkpoint_is_ignored(tmp_path):
    (tmp_path / "checkpoints" / "step_9.tmp").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_8").mkdir()  # no trainer_state.pt: incomplete
    assert latest_checkpoint(tmp_path) is None


def test_truncate_drops_later_steps_and_torn_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 6)) + '{"step": 6, "x"')
    truncate_jsonl(path, 3)
    assert [r["step"] for r in read_jsonl(path)] == [1, 2, 3]


def test_a_log_being_written_reads_as_its_whole_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert read_jsonl(path) == []
    path.write_text('{"step": 1}\n\n{"step": 2}\n{"step": 3, "rew')  # the writer is mid-line
    assert [r["step"] for r in read_jsonl(path)] == [1, 2]
    path.write_text('{"step": 1}\n{"step": 2}')  # a last line not yet ended is not a record yet
    assert [r["step"] for r in read_jsonl(path)] == [1]


def test_logger_appends_after_resume(tmp_path):
    log = MetricsLogger(tmp_path, {}, tensorboard=True)
    for s in (1, 2, 3):
        log.log(s, {"reward/mean": s / 10})
    log.close()
    log = MetricsLogger(tmp_path, {}, resume_step=2, tensorboard=False)
    log.log(3, {"reward/mean": 0.9})
    log.close()
    assert [(r["step"], r["reward/mean"]) for r in read_jsonl(tmp_path / "metrics.jsonl")] == [
        (1, 0.1), (2, 0.2), (3, 0.9)
    ]
    assert any((tmp_path / "tensorboard").iterdir())


def test_pass_at_k_matches_the_unbiased_estimator():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 1, 1) == 0.25
    assert abs(pass_at_k(4, 1, 2) - 0.5) < 1e-12  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 3, 2) == 1.0
