"""Make `builtin:arith-chat` (cadence/assets/arith-chat-tiny): the built-in arithmetic model taught
to answer through a chat template, the small chat model that RLVR trains through its template.

    python scripts/make_arith_chat.py                       # -> runs/sft-arith-chat
    python scripts/make_arith_chat.py --output cadence/assets/arith-chat-tiny --overwrite

It starts from `builtin` (cadence/assets/arith-tiny). Its tokenizer gains Phi-3-style turn
tokens (`<|user|>`, `<|assistant|>`, `<|system|>`, `<|end|>` = EOS) and a chat template; the
model learns the `arith` task's warm-up examples with each problem a user turn, rendered
exactly as RLVR renders it (`cadence.rollout.render`), and the answer then `<|end|>` as the
assistant's reply (the loss on the reply only). The examples keep the built-in's sloppy habit (a share of
carrying problems answered without the carry), which RL then removes, as it does for `builtin`.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch
import yaml

from cadence.data.arithmetic import TERMINATOR, ArithmeticTask
from cadence.data.options import ArithOptions
from cadence.data.tasks import Prompt
from cadence.models.loading import load_policy, load_tokenizer
from cadence.recipes.sft import Row, fit
from cadence.rollout.render import PromptRenderer
from cadence.runtime.threads import configure_threads

# Phi-3's turn markup, without its newlines: each role and the end of a turn one special token,
# so the answer follows the problem two tokens later (`37+45=<|end|><|assistant|>82<|end|>`),
# close to where the built-in model answers it.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|' + message.role + '|>' + message.content + '<|end|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>' }}{%- endif -%}"
)
TURN_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]

SETTINGS = {  # what the shipped asset was made with (written beside it as sft_config.yaml)
    "seed": 0,
    "start": "builtin",
    "task": {"name": "arith", "kwargs": {"sft_carry_slip": 0.6}, "seed": 0},
    "examples": 20000,
    "steps": 800,
    "lr": 0.003,
    "batch_size": 32,
    "threads": 1,
}


def chat_tokenizer(start: str):
    """`start`'s tokenizer with the turn markers (special tokens) and the chat template."""
    tok = load_tokenizer(start)
    tok.add_special_tokens({"additional_special_tokens": TURN_TOKENS})
    tok.eos_token = "<|end|>"
    tok.chat_template = CHAT_TEMPLATE
    return tok


def training_rows(tok, settings: dict) -> list[Row]:
    """Each warm-up example as RLVR will see it: the rendered prompt, then the reply (with loss)."""
    task = ArithmeticTask(ArithOptions(**settings["task"]["kwargs"]), seed=settings["task"]["seed"])
    render = PromptRenderer(tok, chat=True)
    rows = []
    for k, (problem, completion) in enumerate(task.sft_examples(settings["examples"])):  # never the test split
        prompt = render.ids(Prompt(id=str(k), text=problem, answer=""))
        reply = tok(completion.removesuffix(TERMINATOR), add_special_tokens=False).input_ids + [tok.eos_token_id]
        rows.append((prompt + reply, [0] * len(prompt) + [1] * len(reply)))
    return rows


def make(output: Path, settings: dict) -> Path:
    configure_threads(settings["threads"])
    torch.manual_seed(settings["seed"])
    tok = chat_tokenizer(settings["start"])
    model = load_policy(settings["start"])
    model.resize_token_embeddings(len(tok))
    for config in (model.config, model.generation_config):
        config.eos_token_id = tok.eos_token_id
    rows = training_rows(tok, settings)
    fit(model, rows, tok.pad_token_id, random.Random(settings["seed"]), steps=settings["steps"], lr=settings["lr"],
        batch_size=settings["batch_size"])
    output.mkdir(parents=True, exist_ok=True)
    for part in (model.eval(), tok):
        part.save_pretrained(output)
    made_by = "# Made by `python scripts/make_arith_chat.py` (these are its settings).\n"
    (output / "sft_config.yaml").write_text(made_by + yaml.safe_dump(settings, sort_keys=False))
    return output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=Path("runs/sft-arith-chat"))
    parser.add_argument("--overwrite", action="store_true", help="replace a folder that already holds files")
    args = parser.parse_args()
    if args.output.is_dir() and any(args.output.iterdir()) and not args.overwrite:
        raise SystemExit(f"--output {args.output} already holds files; pass --overwrite to replace them")
    make(args.output, SETTINGS)


if __name__ == "__main__":
    main()
