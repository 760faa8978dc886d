"""The critics and actor_attn hosted in their own Ray actors (`runtime.critic_actor`,
`runtime.credit_actor`).

The trainer uses each exactly as the local object (`CriticEnsemble`,
`AttentionCredit`): batches travel on CPU through Ray's object store (it holds
host memory), results come back to the batch's device, and the forward and
backward passes run on the actor's own CPUs (or GPU). Recovery is the one
policy of `cadence.runtime.actors`: actor_attn is rebuilt in place and given
the policy's last weights again; the critics' state lived only in their actor,
so their death ends the step and the run resumes from its last checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor
from transformers import PreTrainedModel

from cadence.algo.asyppo import CriticConfig
from cadence.algo.rhythm import CreditMode, RhythmConfig
from cadence.models.loading import load_policy
from cadence.runtime.actors import RayActor, Recovery
from cadence.train.batch import TrainBatch
from cadence.train.credit import AttentionCredit
from cadence.train.critics import CriticEnsemble


def _actor_options(cpus: float, resources: dict[str, float] | None) -> dict:
    return {"num_cpus": cpus, "resources": resources or None}


def _build_critics(cfg: CriticConfig, policy_path: str, seed: int, micro_batch_size: int, cpus: float) -> CriticEnsemble:
    torch.set_num_threads(max(1, int(cpus)))  # in the actor's process, where the ensemble lives
    return CriticEnsemble(cfg, load_policy(policy_path), policy_path, seed, micro_batch_size)


def _build_credit(policy_path: str, credit: CreditMode, cfg: RhythmConfig, pad_id: int, cpus: float) -> AttentionCredit:
    torch.set_num_threads(max(1, int(cpus)))
    return AttentionCredit(load_policy(policy_path), credit, cfg, pad_id)


class RemoteCritics:
    """A `CriticEnsemble` in its own actor. No restore: its weights and moments change every step and
    live only there; a dead one raises ActorDiedError and the supervisor resumes the run."""

    def __init__(
        self, cfg: CriticConfig, policy_path: str, seed: int, micro_batch_size: int, cpus: float,
        resources: dict[str, float] | None = None,
    ) -> None:
        import functools

        make = functools.partial(_build_critics, cfg, policy_path, seed, micro_batch_size, cpus)
        self.actor: RayActor[CriticEnsemble] = RayActor(make, _actor_options(cpus, resources), Recovery("critic"))
        self.num_critics = cfg.num_critics

    def values(self, batch: TrainBatch) -> Tensor:
        return self.actor.call(CriticEnsemble.values, batch.to("cpu")).to(batch.mask.device)

    def update(self, batch: TrainBatch, returns: Tensor, old_values: Tensor) -> dict[str, float]:
        return self.actor.call(CriticEnsemble.update, batch.to("cpu"), returns.cpu(), old_values.cpu())

    def num_parameters(self) -> int:
        return self.actor.call(CriticEnsemble.num_parameters)

    def checkpoint_activations(self) -> None:
        self.actor.call(CriticEnsemble.checkpoint_activations)

    def state_dict(self) -> dict:
        return self.actor.call(CriticEnsemble.state_dict)

    def load_state_dict(self, state: dict) -> None:
        self.actor.call(CriticEnsemble.load_state_dict, state)


class RemoteCredit:
    """`AttentionCredit` in its own actor: weights go to it after every step (one object-store copy,
    kept by the driver for a replacement), batches in and gammas out."""

    def __init__(
        self,
        policy: PreTrainedModel,
        policy_path: str,
        credit: CreditMode,
        cfg: RhythmConfig,
        pad_id: int,
        cpus: float,
        resources: dict[str, float] | None = None,
        max_restarts: int = 3,
        run_dir: Path | None = None,
    ) -> None:
        import functools

        make = functools.partial(_build_credit, policy_path, credit, cfg, pad_id, cpus)
        recovery = Recovery("actor_attn", max_restarts, run_dir)
        self.actor: RayActor[AttentionCredit] = RayActor(
            make, _actor_options(cpus, resources), recovery,
            restore=lambda actor: actor.call(AttentionCredit.update_weights, *self._weights),
        )
        self.last_seconds = 0.0
        self.update_weights(policy.state_dict(), 0)  # the trainer's weights (a resumed run's differ from the path's)

    def update_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        import ray

        self._weights = (ray.put({k: v.detach().cpu() for k, v in state_dict.items()}), version)
        self.actor.call(AttentionCredit.update_weights, *self._weights)

    def gammas(self, batch: TrainBatch) -> tuple[Tensor, dict[str, float]]:
        gammas, metrics = self.actor.call(AttentionCredit.gammas, batch.to("cpu"))
        self.last_seconds = metrics["rhythm/attention_seconds"]
        return gammas.to(batch.mask.device), metrics
