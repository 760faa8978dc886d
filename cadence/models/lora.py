"""LoRA adapters on the policy, with PEFT: wrapping, merged weights for the engines, export.

With `model.lora` on, the policy is a `peft.PeftModel` whose base weights are
frozen; each targeted linear layer computes

    h = W x + (alpha / r) * B A x,   A: [r, in], B: [out, r], B = 0 at the start

so only A and B train (and sit in the optimizer), the starting policy is the
base model exactly, and the KL reference is that same base with the adapters
switched off (`PeftModel.disable_adapter()`): no second copy of the model.

Engines take a plain model's full state dict, so what a weight sync sends is
the merged weight W' = W + (alpha / r) * B A under each base name, computed
into a new dict: the trained model itself is never merged in place.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import Tensor
from transformers import PreTrainedModel

from cadence.models.config import LoraConfig

ADAPTER_CONFIG = "adapter_config.json"  # what PEFT's save_pretrained writes beside adapter_model.safetensors


def with_lora(model: PreTrainedModel, cfg: LoraConfig, seed: int = 0) -> PreTrainedModel:
    """`model` wrapped in fresh LoRA adapters (a `PeftModel`); its own weights are frozen.

    A is initialised from `seed` with the run's RNG untouched (B starts at zero, so the
    wrapped model computes exactly what `model` did).
    """
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_cfg = PeftLoraConfig(
        r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=cfg.target_modules,
        bias="none", task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return get_peft_model(model, peft_cfg)


def is_lora(model: torch.nn.Module) -> bool:
    """Whether `model` carries LoRA adapters (without importing PEFT when nothing has)."""
    if "peft" not in sys.modules:
        return False
    from peft import PeftModel

    return isinstance(model, PeftModel)


def adapter_state(model: PreTrainedModel) -> dict[str, Tensor]:
    """The adapters' weights alone (PEFT's names, as in adapter_model.safetensors)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model)


def load_adapter_state(model: PreTrainedModel, state: dict[str, Tensor]) -> None:
    """Put `adapter_state`'s weights back into `model`'s adapters; every adapter weight must be there."""
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(model, state)
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if missing:
        raise ValueError(f"the saved adapter lacks {len(missing)} weights of this model's adapters, e.g. {missing[0]}")


@torch.no_grad()
def merged_state_dict(model: PreTrainedModel) -> dict[str, Tensor]:
    """The plain model's state dict with every adapter merged in: W + (alpha / r) * B A under the
    base layer's name (`...q_proj.weight`), on CPU. The adapters and `model` are left as they are."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    adapter = model.active_adapter
    deltas = {
        f"{name}.weight": module.get_delta_weight(adapter)
        for name, module in base.named_modules()
        if isinstance(module, LoraLayer) and adapter in module.lora_A
    }
    merged = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        key = key.replace(".base_layer.", ".")
        merged[key] = (value + deltas[key].to(value.dtype) if key in deltas else value).detach().cpu()
    return merged


def adapter_base_path(folder: Path) -> str:
    """The base model an adapter checkpoint was trained on (PEFT's `base_model_name_or_path`)."""
    return json.loads((folder / ADAPTER_CONFIG).read_text())["base_model_name_or_path"]


def is_adapter_folder(folder: Path) -> bool:
    return (folder / ADAPTER_CONFIG).is_file() and not (folder / "config.json").is_file()


def load_merged(folder: Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """A plain causal LM: the adapter checkpoint in `folder` merged into its base model."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base_path = adapter_base_path(folder)
    if not (Path(base_path) / "config.json").is_file():
        raise FileNotFoundError(
            f"{folder / ADAPTER_CONFIG}: its base model {base_path} is not a local checkpoint folder; "
            "set base_model_name_or_path there to the folder of the model it was trained on"
        )
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype)
    return PeftModel.from_pretrained(base, folder).merge_and_unload()
