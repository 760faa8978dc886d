"""Checkpoints: Hugging Face weights plus everything needed to resume exactly.

Layout of `<run>/checkpoints/step_N/`:
  config.json, model.safetensors, tokenizer files  -> `from_pretrained` loads it
  trainer_state.pt  -> optimizer, scheduler, version, RNG states (torch, python,
                       numpy, and each rollout engine's sampling generator),
                       data cursor, counters (samples seen), and the step number
  run_config.yaml   -> the config this checkpoint was trained under (what
                       `--resume` compares the new config with)
  sharded/          -> data-parallel runs only: torch.distributed.checkpoint
                       shards of weights and optimizer state (the optimizer is
                       then not in trainer_state.pt); loads into any rank count
A checkpoint is written to `step_N.tmp` and renamed when complete, so a kill
during the save never leaves a half checkpoint that resume would pick.
"""

from __future__ import annotations

import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

STATE_FILE = "trainer_state.pt"
SHARDED_DIR = "sharded"  # data-parallel runs: weights and optimizer state per rank (DCP)


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_initialized():  # a CUDA trainer in this process (dropout draws from the GPU's RNG)
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    found = []
    root = checkpoint_dir(run_dir)
    if root.exists():
        for p in root.iterdir():
            m = re.fullmatch(r"step_(\d+)", p.name)
            if m and (p / STATE_FILE).exists():
                found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    state: dict[str, Any],
    keep: int,
    files: dict[str, str] | None = None,
    save_trainer: Callable[[Path], None] | None = None,
) -> Path:
    """Write `step_N` atomically: weights, tokenizer, `state` as `trainer_state.pt` (a run's:
    `RunState.to_dict()`), text `files`, and what `save_trainer(folder)` writes (`Trainer.save`:
    a data-parallel trainer's DCP shards)."""
    final = checkpoint_dir(run_dir) / f"step_{step}"
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    torch.save(state, tmp / STATE_FILE)
    for name, text in (files or {}).items():
        (tmp / name).write_text(text)
    if save_trainer is not None:
        save_trainer(tmp)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for _, old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def save_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Each data-parallel rank writes the weights and optimizer state it holds (DCP), under
    `folder/sharded`. Keys are the plain model's parameter names, so any number of ranks,
    or one process, can load them (`load_sharded` reshards)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=folder / SHARDED_DIR)


def load_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Weights and optimizer state from `folder/sharded`, resharded to this process's ranks."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)  # the layout to read into
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=folder / SHARDED_DIR)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def load_full_optimizer(
    model: torch.nn.Module, names: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """A one-process optimizer state (parameters by position) into a data-parallel optimizer.

    Positions follow `names.named_parameters()` (the plain model the state was saved from;
    tied weights appear once); each rank keeps its shard of the full tensors.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    fqns = [n for n, p in names.named_parameters() if p.requires_grad]
    by_name = {
        "state": {fqns[i]: v for i, v in state["state"].items()},
        "param_groups": [{**g, "params": [fqns[i] for i in g["params"]]} for g in state["param_groups"]],
    }
    set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))


def load_state(path: Path) -> dict[str, Any]:
    return torch.load(path / STATE_FILE, weights_only=False)
