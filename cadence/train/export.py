"""`cadence export`: a run's (or checkpoint's) policy as plain Hugging Face weights.

A LoRA run's checkpoints hold only the adapter (PEFT's format); the export
merges it into the base model, so the folder it writes loads with
`AutoModelForCausalLM.from_pretrained` alone, like any full checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from cadence.models.loading import load_policy, model_path_problem
from cadence.train.checkpoint import checkpoint_dir, latest_checkpoint


def checkpoint_folder(source: Path) -> Path:
    """A run folder's latest checkpoint, or `source` itself when it is a checkpoint."""
    if checkpoint_dir(source).is_dir():
        found = latest_checkpoint(source)
        if found is None:
            raise ValueError(f"{source} is a run folder without a complete checkpoint yet")
        return found[1]
    return source


def export_merged(source: Path, out: Path, dtype: str = "float32") -> Path:
    """Write the policy of `source` (run folder or checkpoint) to `out`: weights and tokenizer."""
    folder = checkpoint_folder(source)
    problem = model_path_problem(str(folder))
    if problem:
        raise ValueError(problem)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} is not empty; give a new folder")
    model = load_policy(str(folder), dtype)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(folder).save_pretrained(out)
    return folder
