"""`RolloutConfig`: how a step's responses are sampled, filtered and scheduled."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cadence.inference.config import EngineConfig, Temperature


class LengthSimulation(BaseModel):
    """Benchmark mode: force long-tailed response lengths on a real engine.

    Each response is generated to a length drawn from a log-normal distribution
    (stop strings and EOS ignored), reproducing the long tail of reasoning
    models' responses with real decode work. Rewards still read the text.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    median_tokens: int = Field(32, gt=0, description="Median forced response length.")
    sigma: float = Field(1.0, gt=0, description="Log-normal sigma; 1.0 puts the longest of 128 near 15x the median.")
    max_tokens: int = Field(512, gt=0, description="Cap on a forced length.")


class RolloutConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    prompts_per_step: int = Field(16, gt=0, description="Prompts (groups) in one training batch.")
    group_size: int = Field(8, gt=0, description="Responses sampled per prompt.")
    max_new_tokens: int = Field(
        8, gt=0, description="Longest response, in tokens. Unset with task.name=chain: the "
        "task's longest worked answer (334 with the default options)."
    )
    temperature: Temperature = Field(1.0, description="Sampling temperature (0 = greedy, else >= 0.01).")
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
        "turns and observations); a turn that would not fit ends the episode as truncated. Capped at "
        "the model's max_position_embeddings."
    )
    simulate_lengths: LengthSimulation | None = Field(
        None, description="Benchmark mode only: forced long-tailed response lengths (see LengthSimulation)."
    )
