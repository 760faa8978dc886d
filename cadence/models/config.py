"""`LoraConfig`: the `model.lora` section (LoRA adapters trained with PEFT; cadence/models/lora.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class LoraConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    enabled: bool = Field(
        False, description="Train LoRA adapters instead of every weight (on as soon as any other "
        "model.lora field is given, e.g. model.lora.r=8)."
    )
    r: int = Field(8, gt=0, description="Adapter rank.")
    alpha: float = Field(16.0, gt=0, description="LoRA alpha: the update is scaled by alpha / r.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapters' input while training.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="Module names that get adapters (e.g. [q_proj, v_proj]), or 'all-linear': "
        "every linear layer but the output head (PEFT's target_modules)."
    )

    @model_validator(mode="before")
    @classmethod
    def _given_means_on(cls, data: Any) -> Any:
        """`model.lora.r=8` alone turns LoRA on; `model.lora.enabled=false` still wins."""
        if isinstance(data, dict) and data and "enabled" not in data:
            data = {**data, "enabled": True}
        return data
