"""Load policies and tokenizers from local Hugging Face checkpoints.

`model.path` is either a folder that `AutoModelForCausalLM.from_pretrained`
reads, or one of the small models shipped inside the package (made by
`cadence sft`): `builtin`, the arithmetic model (`cadence/configs/sft_arith.yaml`),
`builtin:frozenlake` (`cadence/configs/sft_frozenlake_turns.yaml`, then `sft_frozenlake.yaml`), `builtin:sokoban`
(`cadence/configs/sft_sokoban.yaml`), `builtin:calc`, a chat model that calls a calculator tool
(`scripts/make_calc_tiny.py`, the agent demo's), or `builtin:arith-chat`, the arithmetic model
answering through a ChatML template (`scripts/make_arith_chat.py`; docs/chat_templates.md).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from cadence.models.lora import ADAPTER_CONFIG, adapter_base_path, is_adapter_folder, load_merged

ASSETS = Path(__file__).resolve().parent.parent / "assets"
BUILTIN_DIR = ASSETS / "arith-tiny"
# model.path name -> (shipped folder, the sft command(s) that regenerate it)
BUILTINS = {
    "builtin": (BUILTIN_DIR, "cadence sft --config cadence/configs/sft_arith.yaml"),
    "builtin:frozenlake": (ASSETS / "frozenlake-tiny", "cadence sft --config cadence/configs/sft_frozenlake_turns.yaml "
                           "&& cadence sft --config cadence/configs/sft_frozenlake.yaml"),
    "builtin:sokoban": (ASSETS / "sokoban-tiny", "cadence sft --config cadence/configs/sft_sokoban.yaml"),
    "builtin:calc": (ASSETS / "calc-tiny", "python scripts/make_calc_tiny.py --output cadence/assets/calc-tiny"),
    "builtin:arith-chat": (ASSETS / "arith-chat-tiny",
                           "python scripts/make_arith_chat.py --output cadence/assets/arith-chat-tiny --overwrite"),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_model_path(path: str) -> Path:
    """Turn `builtin` (or `builtin:<name>`) into the packaged checkpoint; leave other paths as they are."""
    return BUILTINS[path][0] if path in BUILTINS else Path(path).expanduser()


def model_path_problem(path: str) -> str | None:
    """Why `path` cannot be loaded as a causal LM checkpoint, or None if it looks fine.

    Cheap (no weights read), so configs are checked before any expensive work.
    """
    folder = resolve_model_path(path)
    if path in BUILTINS and not (folder / "config.json").exists():
        return (
            f"the built-in model is missing from {folder}; regenerate it with "
            f"`{BUILTINS[path][1]}`"
        )
    if path.startswith("builtin:") and path not in BUILTINS:
        return f"no built-in model {path!r}; the built-ins are {', '.join(BUILTINS)}"
    if not folder.exists():
        return f"no such folder {folder}; give a local Hugging Face checkpoint folder or 'builtin'"
    if is_adapter_folder(folder):  # a LoRA run's checkpoint: loads merged into its base model
        base = adapter_base_path(folder)
        if (Path(base) / "config.json").exists():
            return None
        return (f"{folder} is a LoRA adapter of {base}, which is not a local checkpoint folder; "
                f"set base_model_name_or_path in its {ADAPTER_CONFIG} to the base model's folder")
    if not (folder / "config.json").exists():
        return f"{folder} has no config.json; is it a Hugging Face checkpoint folder (save_pretrained)?"
    has_weights = any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))
    if not has_weights:
        return f"{folder} has no *.safetensors or *.bin weights"
    return None


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """The checkpoint's tokenizer, left-padded, with a pad token (EOS if it has none)."""
    tok = AutoTokenizer.from_pretrained(resolve_model_path(path))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_policy(path: str, dtype: str = "float32") -> PreTrainedModel:
    """A causal LM in train mode, on CPU, in the requested dtype (a LoRA checkpoint: merged into its base)."""
    folder = resolve_model_path(path)
    if is_adapter_folder(folder):
        return load_merged(folder, DTYPES[dtype]).train()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=DTYPES[dtype])
    return model.train()


def enable_activation_checkpointing(model: PreTrainedModel) -> None:
    """Recompute each decoder layer's activations in the backward pass instead of keeping them
    (trainer.gradient_checkpointing). Non-reentrant checkpointing: gradients reach LoRA adapters
    without the inputs requiring grad, and it is the mode torch recommends."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def frozen_copy(model: PreTrainedModel) -> PreTrainedModel:
    """An eval-mode copy with gradients off (reference policy, engine replica)."""
    clone = copy.deepcopy(model).eval()
    for p in clone.parameters():
        p.requires_grad_(False)
    return clone
