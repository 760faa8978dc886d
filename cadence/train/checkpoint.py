"""Checkpoints: Hugging Face weights plus everything needed to resume exactly.

Layout of `<run>/checkpoints/step_N/`:
  config.json, model.safetensors, tokenizer files  -> `from_pretrained` loads it
  trainer_state.pt  -> optimizer, scheduler, version, RNG states (torch, python,
                       numpy, and each rollout engine's sampling generator),
                       data cursor, counters (samples seen), and the step number
  run_config.yaml   -> the config this checkpoint was trained under (what
                       `--resume` compares the new config with)
A checkpoint is written to `step_N.tmp` and renamed when complete, so a kill
during the save never leaves a half checkpoint that resume would pick.
"""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

STATE_FILE = "trainer_state.pt"


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


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
) -> Path:
    """Write `step_N` atomically: weights, tokenizer, `trainer_state.pt` and text `files`."""
    final = checkpoint_dir(run_dir) / f"step_{step}"
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    torch.save({"step": step, "rng": rng_state(), **state}, tmp / STATE_FILE)
    for name, text in (files or {}).items():
        (tmp / name).write_text(text)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for _, old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_state(path: Path) -> dict[str, Any]:
    return torch.load(path / STATE_FILE, weights_only=False)
