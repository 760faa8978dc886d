"""Small chat tokenizers (Qwen2 and Llama 3 turn markup) and models for them, built offline.

The templates are written here in the two families' styles: Qwen2 wraps every
message in `<|im_start|>role\\n ... <|im_end|>\\n` (and adds a default system
message); Llama 3 starts with `<|begin_of_text|>` and writes
`<|start_header_id|>role<|end_header_id|>\\n\\n` + content (trimmed) + `<|eot_id|>`.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from cadence.models.tiny import char_tokenizer, tiny_model

QWEN2_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first and message.role != 'system' -%}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

LLAMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "{{ '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif -%}"
)

STYLES = {
    # style: (template, special tokens, bos, end-of-turn token = eos)
    "qwen2": (QWEN2_TEMPLATE, ["<|im_start|>", "<|im_end|>"], None, "<|im_end|>"),
    "llama3": (
        LLAMA3_TEMPLATE,
        ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        "<|begin_of_text|>",
        "<|eot_id|>",
    ),
}


def chat_tokenizer(style: str) -> PreTrainedTokenizerFast:
    """The byte-level char tokenizer plus the style's special tokens and chat template;
    its EOS is the end-of-turn token, as in the families' instruct models."""
    template, specials, bos, eot = STYLES[style]
    tok = char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": specials})
    if bos is not None:
        tok.bos_token = bos
    tok.eos_token = eot
    tok.chat_template = template
    return tok


def chat_model(style: str, tok: PreTrainedTokenizerFast, eot_bias: float | None = None) -> PreTrainedModel:
    """A tiny model for `tok`. With `eot_bias`, its output layer gets a bias: the end-of-turn
    token's logit + eot_bias and every token but lower-case letters and space ruled out, so
    it ends some turns itself and runs out of tokens in others, and writes plain text."""
    arch = "qwen2" if style == "qwen2" else "llama"
    model = tiny_model(arch, vocab_size=len(tok), hidden_size=32, layers=1, heads=2, tokenizer=tok)
    if eot_bias is not None:
        head = torch.nn.Linear(model.config.hidden_size, len(tok), bias=True)
        with torch.no_grad():
            head.weight.copy_(model.get_output_embeddings().weight)
            letters = {tok.convert_tokens_to_ids(c) for c in "abcdefghijklmnopqrstuvwxyz"} | {tok.convert_tokens_to_ids("Ġ")}
            head.bias.fill_(-1e4)
            head.bias[list(letters)] = 0.0
            head.bias[tok.convert_tokens_to_ids(tok.eos_token)] = eot_bias
        model.lm_head = head
    return model.eval()


def save_chat_model(folder: str, style: str = "qwen2") -> str:
    """A tiny chat model and its tokenizer (with the style's template) saved to `folder`."""
    tok = chat_tokenizer(style)
    chat_model(style, tok).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)
