"""Critics for PPO (one, policy-sized) and AsyPPO (M mini-critics).

Each critic is a `ValueModel` with its own AdamW. AsyPPO's diversity comes from
data: within every prompt's group each critic trains on a disjoint share of
the responses (`partition_groups`), and each starts from its own random seed.

Values are aligned with the trainer's [B, L-1] token tensors: entry t is
V(s_t), the value of the prefix that ends at input position t, i.e. the state
in which token t+1 is chosen.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch
from torch import Tensor
from transformers import PreTrainedModel

from cadence.algo.asyppo import CriticConfig, critic_loss, explained_variance, partition_groups
from cadence.models.critic import ValueModel, small_critic_config
from cadence.models.loading import enable_activation_checkpointing
from cadence.train.batch import TrainBatch
from cadence.train.data_parallel import DataParallel, SingleProcess


def build_critic(cfg: CriticConfig, policy: PreTrainedModel, policy_path: str, seed: int) -> ValueModel:
    with torch.random.fork_rng():  # each critic its own init, the run's RNG untouched
        torch.manual_seed(seed)
        return _new_critic(cfg, policy, policy_path)


def _new_critic(cfg: CriticConfig, policy: PreTrainedModel, policy_path: str) -> ValueModel:
    if cfg.critic_path:
        return ValueModel.from_pretrained(cfg.critic_path)
    if cfg.critic_fraction >= 1.0:
        # Classic PPO: a critic as large as the policy, started from the policy's weights.
        return ValueModel.from_pretrained(policy_path)
    return ValueModel.from_config(small_critic_config(policy.config, cfg.critic_fraction))


class Critics(Protocol):
    """What the trainer asks of critics, local or hosted (`cadence.runtime.hosted.RemoteCritics`)."""

    num_critics: int

    def values(self, batch: TrainBatch) -> Tensor: ...

    def update(self, batch: TrainBatch, returns: Tensor, old_values: Tensor) -> dict[str, float]: ...

    def num_parameters(self) -> int: ...

    def checkpoint_activations(self) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class CriticEnsemble:
    def __init__(
        self, cfg: CriticConfig, policy: PreTrainedModel, policy_path: str, seed: int, micro_batch_size: int
    ) -> None:
        self.cfg = cfg
        self.micro = micro_batch_size
        self.critics = [build_critic(cfg, policy, policy_path, seed + 1000 * (m + 1)) for m in range(cfg.num_critics)]
        self.optimizers = [torch.optim.AdamW(c.parameters(), lr=cfg.critic_lr) for c in self.critics]
        self.generator = torch.Generator().manual_seed(seed)
        # Data parallel (set by the trainer): each rank trains every critic on its share of
        # that critic's rows, and the gradients are summed over ranks before the step.
        self.dp: DataParallel = SingleProcess()

    @property
    def num_critics(self) -> int:
        return len(self.critics)

    def num_parameters(self) -> int:
        return sum(c.num_parameters() for c in self.critics)

    def checkpoint_activations(self) -> None:
        """Recompute the critics' activations in their backward passes (trainer.gradient_checkpointing).
        Critics train in full, never with LoRA: AsyPPO's are small and start from random weights."""
        for critic in self.critics:
            enable_activation_checkpointing(critic.backbone)

    def to(self, device: torch.device) -> CriticEnsemble:
        """Critics onto the trainer's device (before their optimizers hold any state)."""
        for critic in self.critics:
            critic.to(device)
        return self

    def _forward(self, critic: ValueModel, batch: TrainBatch) -> Tensor:
        return critic(batch.input_ids, batch.attention_mask)[:, :-1]

    @torch.no_grad()
    def values(self, batch: TrainBatch) -> Tensor:
        """[M, B, L-1] values of every critic (eval mode, no grad)."""
        out = []
        for critic in self.critics:
            critic.eval()
            parts = [self._forward(critic, batch.select(slice(i, i + self.micro))) for i in range(0, len(batch), self.micro)]
            out.append(torch.cat(parts))
            critic.train()
        return torch.stack(out)

    def update(self, batch: TrainBatch, returns: Tensor, old_values: Tensor) -> dict[str, float]:
        """One pass of each critic over its own share of every group; returns metrics."""
        start = time.perf_counter()
        assignment = partition_groups(batch.group_ids, len(self.critics), self.generator)
        metrics: dict[str, float] = {}
        for m, (critic, opt) in enumerate(zip(self.critics, self.optimizers, strict=True)):
            rows = (assignment == m).nonzero().flatten()
            if rows.numel() == 0:
                continue
            opt.zero_grad(set_to_none=True)
            total_tokens = float(batch.mask[rows].sum().clamp(min=1))
            rows = self.dp.rows(rows, batch.attention_mask.sum(1))
            loss_sum = 0.0
            for i in range(0, rows.numel(), self.micro):
                sel = rows[i : i + self.micro]
                part = batch.select(sel)
                values = self._forward(critic, part)
                # critic_loss is a token mean over the part; re-weight to the share's token mean.
                weight = float(part.mask.sum()) / total_tokens
                loss = critic_loss(values, returns[sel], part.mask, old_values[m, sel], self.cfg.value_clip) * weight
                loss.backward()
                loss_sum += loss.item()
            self.dp.reduce_grads(critic.parameters())
            loss_sum = float(self.dp.all_sum(torch.tensor([loss_sum], dtype=torch.float64, device=self.dp.device))[0])
            torch.nn.utils.clip_grad_norm_(critic.parameters(), 1.0)
            opt.step()
            metrics[f"critic/value_loss_{m}"] = loss_sum
            metrics[f"critic/explained_variance_{m}"] = explained_variance(old_values[m], returns, batch.mask)
        metrics["critic/seconds"] = time.perf_counter() - start
        return metrics

    def state_dict(self) -> dict:
        return {
            "critics": [c.state_dict() for c in self.critics],
            "optimizers": [o.state_dict() for o in self.optimizers],
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        for c, s in zip(self.critics, state["critics"], strict=True):
            c.load_state_dict(s)
        for o, s in zip(self.optimizers, state["optimizers"], strict=True):
            o.load_state_dict(s)
        self.generator.set_state(state["generator"])

