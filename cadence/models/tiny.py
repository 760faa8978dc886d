"""Small models built from a config, with a character-level tokenizer.

No model hub is reachable from our machines, so tests, benchmarks and the
built-in default model start from here: a Llama- or Qwen2-architecture
`AutoModelForCausalLM` and a `PreTrainedTokenizerFast` made with the
`tokenizers` library. Both save and load with plain transformers.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per byte, in the byte-level alphabet GPT-2 style tokenizers use.

    The byte-level alphabet (space is 'Ġ', newline 'Ċ') matters: transformers
    rebuilds Qwen2 tokenizers from vocab and merges with its own byte-level
    pre-tokenizer, and only this alphabet survives that unchanged.
    """
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + alphabet)}
    # BPE with no merges splits any text into single bytes.
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
    )


def tiny_config(
    arch: str = "llama",
    vocab_size: int = 260,
    hidden_size: int = 128,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_positions: int = 512,
    tokenizer: PreTrainedTokenizerFast | None = None,
):
    """A small Llama or Qwen2 config; token ids follow `char_tokenizer()`."""
    tok = tokenizer or char_tokenizer()
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or heads,
        intermediate_size=intermediate_size or 4 * hidden_size,
        max_position_embeddings=max_positions,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
    )
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen2":
        return Qwen2Config(**common)
    raise ValueError(f"tiny_config: arch must be 'llama' or 'qwen2', got {arch!r}")


def tiny_model(arch: str = "llama", seed: int = 0, **config_kwargs) -> PreTrainedModel:
    """A randomly initialised small causal LM (float32, eval mode)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **config_kwargs))
    return model.eval()
