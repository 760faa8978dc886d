"""`TaskConfig`: which prompts to train on, validated when the config loads.

Naming scheme for `name`:

* ``"arith"``: the built-in synthetic arithmetic task ("37+45=" -> "82"),
  small enough for a tiny character-level model. `kwargs`: ``operations``
  (default ``["+", "-"]``), ``digits`` (default 2).
* ``"chain"``: built-in addition chains ("37+08=" -> "45, 45+08=53, ..., 101"),
  with long-tailed answer lengths. `kwargs`: ``step_min`` (3), ``step_max`` (40).
* ``"file"``: prompts and answers from data files: JSONL, JSON, parquet, CSV or a
  `datasets` folder (`train_file`, optional `test_file`, `format`, `preset`,
  `prompt_field`, `answer_field`, `test_fraction`; cadence/data/file_task.py).
  ``"jsonl"``, its older name, is the same task.
* ``"repo_bugs"``: built-in repository tasks for coding agents, one injected bug each
  (cadence/data/repo_bugs.py). `kwargs`: ``size`` (300 tasks, test split included).
* ``"rg:<dataset>"``: any reasoning-gym dataset, e.g. ``"rg:countdown"``;
  `kwargs` go to that dataset's config (``min_numbers``, ...).

Validation is deliberately cheap (no prompt is generated and no file is read
beyond checking it exists): mistakes should surface in a second, not after a
model has loaded.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cadence.data.fields import Preset
from cadence.data.options import check_arith_config, check_chain_config, check_repo_bugs_config
from cadence.data.sources import FileFormat, find_files

TaskKind = Literal["arith", "chain", "file", "repo_bugs", "rg"]
ChatTemplate = Literal["auto", "on", "off"]
RG_PREFIX = "rg:"


def task_kind(name: str) -> TaskKind:
    """Classify a task name, or explain the accepted forms."""
    if name in ("arith", "chain", "repo_bugs"):
        return name  # type: ignore[return-value]
    if name in ("file", "jsonl"):  # jsonl: the older name of file
        return "file"
    if name.startswith(RG_PREFIX):
        return "rg"
    raise ValueError(
        f"task.name {name!r} is not a known task: use 'arith', 'chain' or 'repo_bugs' (built-in), 'file' "
        "(with task.train_file), or 'rg:<reasoning-gym dataset>' such as 'rg:countdown'"
    )


class TaskConfig(BaseModel):
    """Which prompt source to use and how to split it into train and test."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        "arith",
        description="Task: 'arith' (built-in arithmetic), 'chain' (built-in addition "
        "chains, long-tailed answers), 'repo_bugs' (built-in repository tasks for coding agents), "
        "'file' (data files), or "
        "'rg:<dataset>' for a reasoning-gym dataset, e.g. 'rg:countdown'.",
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Task options: for 'arith' operations/digits; for 'chain' "
        "step_min/step_max; for 'repo_bugs' size; for 'rg:*' the "
        "reasoning-gym dataset config fields (not seed/size, which cadence sets).",
    )
    train_file: str | list[str] | None = Field(
        None,
        description="Training data ('file' only, required): a .jsonl/.json/.parquet/.csv file, a "
        "folder written by datasets' save_to_disk, a glob, or a list of them.",
    )
    test_file: str | list[str] | None = Field(
        None,
        description="Test data, as train_file ('file' only); without it a deterministic "
        "test_fraction of train_file is held out.",
    )
    format: FileFormat = Field(
        "auto", description="Data file format: 'auto' (by extension), jsonl, json, parquet, csv."
    )
    preset: Preset = Field(
        "auto",
        description="Row layout: 'verl' (prompt messages, reward_model.ground_truth), 'trl' "
        "(prompt; answer/ground_truth/solution), 'messages' (the last assistant message is the "
        "answer), or 'auto' (chosen by the file's columns).",
    )
    prompt_field: str | None = Field(
        None,
        description="Field holding the prompt (text or chat messages); a dotted path reaches "
        "into objects. Default: the preset's.",
    )
    answer_field: str | None = Field(
        None,
        description="Field holding the gold answer, e.g. reward_model.ground_truth. Default: "
        "the preset's.",
    )
    test_size: int = Field(
        200,
        ge=0,
        description="Size of the generated test split ('arith', 'chain', 'repo_bugs', 'rg:*'); train never "
        "contains these prompts.",
    )
    test_fraction: float = Field(
        0.1,
        gt=0.0,
        lt=1.0,
        description="Fraction of distinct train_file prompts held out as test when "
        "'file' has no test_file.",
    )
    prompt_suffix: str = Field(
        "",
        description="Appended verbatim to every prompt text (e.g. an answer-format "
        "instruction); include your own leading space/newline.",
    )
    chat_template: ChatTemplate = Field(
        "auto",
        description="Render prompts with the model's chat template: 'auto' (when its tokenizer has "
        "one), 'on' (an error at load when it has none), 'off' (the raw text).",
    )
    system_prompt: str | None = Field(
        None, description="A system message before every prompt (raw text: a line before it)."
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Passed to the chat template, e.g. {enable_thinking: false} for Qwen3.",
    )
    seed: int = Field(0, description="Seed for prompt generation and splitting.")

    @field_validator("chat_template", mode="before")
    @classmethod
    def _on_off(cls, value: Any) -> Any:
        return ("on" if value else "off") if isinstance(value, bool) else value  # YAML reads on/off as booleans

    @model_validator(mode="after")
    def _check(self) -> TaskConfig:
        kind = task_kind(self.name)
        if kind != "file":
            for attr in ("train_file", "test_file"):
                if getattr(self, attr) is not None:
                    raise ValueError(
                        f"task.{attr} is only used by task.name 'file' (got name {self.name!r})"
                    )
        if kind == "arith":
            check_arith_config(self.kwargs, self.test_size)
        elif kind == "chain":
            check_chain_config(self.kwargs, self.test_size)
        elif kind == "file":
            self._check_files()
        elif kind == "repo_bugs":
            check_repo_bugs_config(self.kwargs, self.test_size)
        else:
            check_rg_dataset(self.name[len(RG_PREFIX) :], self.kwargs)
        return self

    def _check_files(self) -> None:
        """Cheap checks (the files exist, their formats are known); cadence.config.check_data
        reads them before the model loads."""
        if self.kwargs:
            raise ValueError(f"task.kwargs is not used by task.name {self.name!r} (got {self.kwargs})")
        if not self.train_file:
            raise ValueError(f"task.name {self.name!r} needs task.train_file (a data file, glob or folder)")
        for attr in ("train_file", "test_file"):
            value = getattr(self, attr)
            if value is not None:
                find_files(value, self.format, f"task.{attr}")
        if self.prompt_field is not None and self.prompt_field == self.answer_field:
            raise ValueError("task.prompt_field and task.answer_field must differ")


def check_rg_dataset(name: str, kwargs: dict[str, Any]) -> None:
    """Check a reasoning-gym dataset name and its kwargs without generating anything."""
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        close = difflib.get_close_matches(name, DATASETS, n=5, cutoff=0.5)
        hint = f" Did you mean: {', '.join(RG_PREFIX + c for c in close)}?" if close else ""
        raise ValueError(
            f"task.name {RG_PREFIX + name!r}: no reasoning-gym dataset {name!r}.{hint} "
            f"({len(DATASETS)} datasets exist, e.g. rg:countdown, rg:basic_arithmetic)"
        )
    _, config_cls = DATASETS[name]
    reserved = sorted({"seed", "size"} & kwargs.keys())
    if reserved:
        raise ValueError(
            f"task.kwargs {reserved} are set by cadence (use task.seed / task.test_size)"
        )
    fields = {f.name for f in dataclasses.fields(config_cls)} - {"seed", "size"}
    unknown = sorted(kwargs.keys() - fields)
    if unknown:
        raise ValueError(
            f"task.kwargs {unknown} are not options of reasoning-gym dataset {name!r}; "
            f"valid: {sorted(fields)}"
        )
    try:
        config = config_cls(**kwargs)
        if callable(getattr(config, "validate", None)):
            config.validate()
    except Exception as exc:  # the dataset's own checks: assertion, type or value errors
        raise ValueError(
            f"task.kwargs rejected by reasoning-gym dataset {name!r}: {type(exc).__name__}: {exc}"
        ) from exc
