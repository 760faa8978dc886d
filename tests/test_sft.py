"""The supervised warm-up recipe: trains, saves a checkpoint plain transformers loads."""

from __future__ import annotations

import random

import torch
from transformers import AutoModelForCausalLM

from cadence.models.loading import load_policy, load_tokenizer
from cadence.recipes.sft import encode_examples, fit, load_sft_config, make_batch, sft


def test_sft_chain_warm_up_saves_a_loadable_checkpoint(tmp_path):
    out = sft(load_sft_config(None, [
        "model.path=builtin", "task.name=chain", "steps=3", "examples=200", "group_by_length=true",
        "threads=1", f"output={tmp_path / 'sft'}",
    ]))
    assert (out / "sft_config.yaml").is_file()
    assert AutoModelForCausalLM.from_pretrained(out).config.vocab_size == 260


def test_fit_lowers_the_loss_on_its_examples():
    torch.manual_seed(0)
    tokenizer, model = load_tokenizer("builtin"), load_policy("builtin")
    data = encode_examples(tokenizer, [("12+30=", "42, 42+30=72, 72+30=102\n")] * 8)

    def loss() -> float:
        with torch.no_grad():
            ids, attn, labels = make_batch(data, tokenizer.pad_token_id)
            return model(input_ids=ids, attention_mask=attn, labels=labels).loss.item()

    before = loss()
    fit(model.train(), data, tokenizer.pad_token_id, random.Random(0), steps=25, lr=3e-3, batch_size=8)
    assert loss() < 0.5 * before
