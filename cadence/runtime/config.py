"""`RuntimeConfig`: where a run's pieces execute (this process, Ray actors, data-parallel ranks).

`check_runtime` holds the placement cross-checks: settings of the runtime that
cannot work with the rollout, trainer or algorithm sections, reported at load
time before any process or actor starts.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from cadence.algo.config import AlgorithmConfig
    from cadence.rollout.config import RolloutConfig
    from cadence.train.config import TrainerConfig


class RuntimeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

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


def check_runtime(
    runtime: RuntimeConfig, rollout: RolloutConfig, trainer: TrainerConfig, algorithm: AlgorithmConfig
) -> None:
    """Placement settings that cannot work with the other sections, one `ValueError` naming the fix."""
    if runtime.critic_actor and (runtime.kind != "ray" or not algorithm.uses_critics):
        raise ValueError(
            "runtime.critic_actor=true needs runtime.kind=ray and algorithm.name=ppo or asyppo"
        )
    if runtime.credit_actor and (runtime.kind != "ray" or algorithm.credit == "none"):
        raise ValueError(
            "runtime.credit_actor=true needs runtime.kind=ray and algorithm.credit=local, global or coupled"
        )
    _check_trainer_workers(runtime, rollout, trainer)
    if runtime.kind == "inline" and runtime.rollout_workers > 1:
        raise ValueError(
            "runtime.rollout_workers > 1 needs runtime.kind=ray (inline runs one worker)"
        )
    workers, ro = runtime.rollout_workers, rollout
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
    if not ro.replicate_prompts and ro.prompts_per_step < workers:
        raise ValueError(
            f"rollout.prompts_per_step={ro.prompts_per_step} is smaller than "
            f"runtime.rollout_workers={workers}: every worker needs a prompt per step"
        )


def _check_trainer_workers(runtime: RuntimeConfig, rollout: RolloutConfig, trainer: TrainerConfig) -> None:
    """Data-parallel trainer settings that cannot work, before any rank starts."""
    ranks, rt = runtime.trainer_workers, runtime
    if ranks == 1:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if rt.kind == "inline" and ranks > cores:
        raise ValueError(
            f"runtime.trainer_workers={ranks} exceeds the {cores} CPUs of this machine (one per rank); "
            f"set runtime.trainer_workers<={cores}, or runtime.kind=ray on a cluster"
        )
    import torch  # loaded by the config already

    from cadence.train.device import wants_cuda

    if rt.kind == "inline" and wants_cuda(trainer.device) and ranks > torch.cuda.device_count():
        raise ValueError(
            f"runtime.trainer_workers={ranks} with trainer.device={trainer.device} needs a GPU per rank (NCCL) and "
            f"this machine has {torch.cuda.device_count()}; lower runtime.trainer_workers, or set trainer.device=cpu"
        )
    mini = rollout.prompts_per_step * rollout.group_size // trainer.mini_batches
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
