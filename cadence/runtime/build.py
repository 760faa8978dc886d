"""Build the policy trainer of a run from its config: policy, reference, critics, credit (in this
process, or hosted in their own Ray actors: `cadence.runtime.hosted`).

The recipe calls `build_trainer` for a one-process trainer; each data-parallel
rank calls `build_rank_trainer` in its own process (`runtime.trainer_workers > 1`).
"""

from __future__ import annotations

import torch

from cadence.config import RunConfig
from cadence.models.loading import frozen_copy, load_policy
from cadence.runtime.hosted import RemoteCredit, RemoteCritics
from cadence.train.credit import AttentionCredit
from cadence.train.critics import CriticEnsemble
from cadence.train.data_parallel import DataParallel
from cadence.train.trainer import PolicyTrainer


def build_trainer(
    cfg: RunConfig, pad_id: int, weights: dict[str, torch.Tensor] | None = None, dp: DataParallel | None = None
) -> PolicyTrainer:
    """The trainer starting from `cfg.model.path`, or from `weights` (a resumed run's); the KL
    reference is always the starting model."""
    policy = load_policy(cfg.model.path, cfg.model.dtype)
    reference = frozen_copy(policy) if cfg.algorithm.kl.coef > 0 else None
    if weights is not None:
        policy.load_state_dict(weights)
    critics = None
    if cfg.runtime.critic_actor:
        critics = RemoteCritics(
            cfg.algorithm.critic, cfg.model.path, cfg.seed, cfg.trainer.micro_batch_size, cfg.runtime.critic_cpus,
            cfg.runtime.critic_resources,
        )
    elif cfg.algorithm.uses_critics:
        critics = CriticEnsemble(cfg.algorithm.critic, policy, cfg.model.path, cfg.seed, cfg.trainer.micro_batch_size)
    credit = None
    if cfg.runtime.credit_actor:
        credit = RemoteCredit(
            policy, cfg.model.path, cfg.algorithm.credit, cfg.algorithm.rhythm, pad_id, cfg.runtime.credit_cpus,
            cfg.runtime.critic_resources, max_restarts=cfg.runtime.actor_restarts, run_dir=cfg.run_dir(),
        )
    elif cfg.algorithm.credit != "none":
        credit = AttentionCredit(policy, cfg.algorithm.credit, cfg.algorithm.rhythm, pad_id)
    return PolicyTrainer(
        policy, cfg.trainer, cfg.algorithm, cfg.rollout.temperature, pad_id, reference,
        critics=critics, credit=credit, dp=dp,
    )


def build_rank_trainer(cfg: RunConfig, pad_id: int, checkpoint: str | None, dp: DataParallel) -> PolicyTrainer:
    """One data-parallel rank's trainer, from the run's checkpoint folder when resuming."""
    torch.manual_seed(cfg.seed)
    weights = load_policy(checkpoint, cfg.model.dtype).state_dict() if checkpoint else None
    return build_trainer(cfg, pad_id, weights, dp)
