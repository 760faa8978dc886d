"""`cadence train model.lora.r=8 ...` end to end: trains, checkpoints the adapter, resumes, exports."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from cadence.cli import app
from cadence.models.loading import resolve_model_path
from cadence.observe.metrics import read_jsonl
from tests.quick_run import QUICK_RUN

pytestmark = pytest.mark.slow

RUN = [*QUICK_RUN, "rollout.max_new_tokens=6", "trainer.lr=1e-2", "model.lora.r=8",
       "trainer.gradient_checkpointing=true"]


def cadence(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def metrics(run: Path) -> list[dict]:
    return read_jsonl(run / "metrics.jsonl")


def test_lora_trains_with_kl_async_and_asyppo_critics_resumes_and_exports(tmp_path):
    """One run checks it all (a train is most of the time): AsyPPO's critics train beside the adapters."""
    run = tmp_path / "run"
    args = [*RUN, f"logging.run_dir={run}", "algorithm.kl.coef=0.05", "rollout.async_ratio=1", "algorithm.name=asyppo"]
    cadence("train", *args, "trainer.steps=2")
    step_2 = run / "checkpoints" / "step_2"
    assert (step_2 / "adapter_config.json").is_file() and not (step_2 / "model.safetensors").exists()
    base = AutoModelForCausalLM.from_pretrained(resolve_model_path("builtin"))
    adapted = PeftModel.from_pretrained(base, step_2)
    lora_b = [p for n, p in adapted.named_parameters() if "lora_B" in n]
    assert any(p.abs().max() > 0 for p in lora_b)  # the adapters trained (B starts at zero)
    first = metrics(run)
    assert [r["step"] for r in first] == [1, 2] and first[1]["train/kl_ref"] > 0
    assert "critic/value_loss_1" in first[1] and first[1]["train/grad_norm"] > 0

    cadence("train", *args, "trainer.steps=3", "--resume", "--allow-change", "trainer.steps")
    assert [r["step"] for r in metrics(run)] == [1, 2, 3]
    assert (run / "checkpoints" / "step_3" / "adapter_model.safetensors").is_file()

    cadence("export", str(run), str(tmp_path / "hf"))
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(resolve_model_path("builtin")),
                                       run / "checkpoints" / "step_3").merge_and_unload()
    for name, value in merged.state_dict().items():
        torch.testing.assert_close(exported.state_dict()[name], value)
    out = cadence("eval", str(run / "checkpoints" / "step_3"), "task.test_size=8", "logging.progress=false")
    assert "pass@1" in out

