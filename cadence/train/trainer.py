"""The policy trainer: advantages, policy loss, optimizer step, new version.

One `step(groups)` consumes one rollout batch:
  1. collate groups into tensors;
  2. pi_old: recomputed by a no-grad pass unless it provably equals pi_theta
     (a single update per batch, stale samples included: staleness is corrected
     against the engine's behaviour log-probs mu, never against pi_old); pi_ref when KL is on;
  3. advantages from rewards (and group ids);
  4. `epochs` x `mini_batches` optimizer updates, each accumulated over
     micro-batches whose losses sum exactly to the mini-batch loss (with stale
     samples, staleness bucket by bucket: the norm of each bucket's part of the
     gradient is logged, `trainer.grad_norm_by_staleness`);
  5. version += 1 (only if the weights changed), so the next weight sync tags new
     samples with it.

Everything computes on `trainer.device` (data-parallel ranks: their own GPU):
the models live there, the batch is moved there once, metrics come back as
Python floats, and what leaves the trainer (weights, checkpoint state) is on CPU.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import PreTrainedModel

from cadence.algo.advantages import compute_advantages
from cadence.algo.advantages import spec as advantage_spec
from cadence.algo.asyppo import aggregate_values, uncertainty_masks
from cadence.algo.config import AlgorithmConfig
from cadence.algo.kl import AdaptiveKLController, shape_token_rewards
from cadence.algo.losses import PolicyLossInputs
from cadence.algo.policy_loss import compute_policy_loss
from cadence.algo.rhythm_shaping import credit_metrics, shape_advantages
from cadence.models.loading import enable_activation_checkpointing, frozen_copy
from cadence.models.lora import adapter_state, is_lora, load_adapter_state, merged_state_dict
from cadence.rollout.sample import Group
from cadence.train.batch import TrainBatch, bucketed_micro_batches, collate, flatten, micro_batches
from cadence.train.checkpoint import load_sharded
from cadence.train.config import TrainerConfig
from cadence.train.credit import AttentionCredit, Credit
from cadence.train.critics import CriticEnsemble, Critics
from cadence.train.data_parallel import DataParallel, SingleProcess
from cadence.train.device import resolve_device, to_cpu
from cadence.train.logprobs import batched_logprobs, forward_logits, token_entropy, token_logprobs

# compute_policy_loss metrics that are sums over micro-batches (each already divided by the
# mini-batch denominators); every other metric is a per-token average.
ADDITIVE_METRICS = {"loss", "pg_loss", "kl_ref", "entropy", "response_tokens"}


def lr_lambda(cfg: TrainerConfig):
    """Multiplier on the base LR at optimizer step `i` (linear warm-up, then decay)."""

    def factor(i: int) -> float:
        if i < cfg.warmup_steps:
            return (i + 1) / cfg.warmup_steps
        total = max(1, cfg.steps * cfg.mini_batches * cfg.epochs - cfg.warmup_steps)
        progress = min(1.0, (i - cfg.warmup_steps) / total)
        if cfg.schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * progress))
        if cfg.schedule == "linear":
            return 1.0 - progress
        return 1.0

    return factor


class GradientAdded:
    """The norm of what the backward passes since the last call added to the accumulated
    gradients: the gradients now minus a copy kept at the last call (no copy before the first)."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.params = params
        self.before: list[torch.Tensor] | None = None

    def norm_since_last(self, keep: bool) -> float:
        """`keep`: copy the gradients for the next call (not needed after the last one)."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        diff = grads if self.before is None else [g - b for g, b in zip(grads, self.before, strict=True)]
        norm = float(torch.nn.utils.get_total_norm(diff))
        if keep:
            self.before = [g.detach().clone() for g in grads]
        return norm


class PolicyTrainer:
    def __init__(
        self,
        policy: PreTrainedModel,
        trainer_cfg: TrainerConfig,
        algo_cfg: AlgorithmConfig,
        temperature: float,
        pad_id: int,
        reference: PreTrainedModel | None = None,
        critics: Critics | None = None,
        credit: Credit | None = None,
        dp: DataParallel | None = None,
    ) -> None:
        """`dp`: this trainer's rank in a data-parallel group; by default it is alone in its process."""
        self.dp = dp if dp is not None else SingleProcess(resolve_device(trainer_cfg.device))
        # A rank computes where its group does (its own GPU under NCCL).
        self.device = self.dp.device
        self.model = policy.train()  # the plain Hugging Face module
        self.cfg = trainer_cfg
        self.algo = algo_cfg
        self.temperature = temperature
        self.pad_id = pad_id
        self.version = 0  # weights the policy has had: +1 per optimizer-changed step
        self.steps = 0  # rollout batches consumed (critic warm-up steps included)
        # LoRA (model.lora): only the adapters train; the KL anchor is the base model with them
        # switched off (`_base_only`), so no copy is made.
        self.lora = is_lora(policy)
        if trainer_cfg.gradient_checkpointing:
            enable_activation_checkpointing(policy)
        # The KL anchor is the starting policy; pass it in when resuming from a later checkpoint.
        if algo_cfg.kl.coef > 0 and reference is None:
            reference = policy if self.lora else frozen_copy(policy)
        self.reference = reference.to(self.device) if algo_cfg.kl.coef > 0 else None
        kl = algo_cfg.kl  # kl.target: the coefficient adapts after every step (Ziegler et al.)
        self.kl_control = AdaptiveKLController(kl.coef, kl.target, kl.horizon) if kl.target is not None else None
        # On the trainer's device; data parallel: DDP's wrapper, or the same module sharded by FSDP2
        # (its parameters become DTensors, so the optimizer is built after this).
        self.policy = self.dp.wrap(policy)
        self.critics = critics
        if critics is not None and trainer_cfg.gradient_checkpointing:
            critics.checkpoint_activations()
        if isinstance(critics, CriticEnsemble):  # remote critics and credit live on their actor's device
            critics.to(self.device)
            critics.dp = self.dp
        # Weights, gradients and AdamW's two moments: 16 bytes per fp32 parameter.
        self._critic_params = critics.num_parameters() if critics is not None else 0
        self.credit = credit.to(self.device) if isinstance(credit, AttentionCredit) else credit
        self.optimizer = torch.optim.AdamW(
            [p for p in self.policy.parameters() if p.requires_grad],
            lr=trainer_cfg.lr,
            betas=trainer_cfg.betas,
            weight_decay=trainer_cfg.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(trainer_cfg))
        if trainer_cfg.grad_norm_by_staleness == "on" and self._why_not_by_staleness():
            raise ValueError(f"trainer.grad_norm_by_staleness=on: {self._why_not_by_staleness()}; set it to auto or off")

    # -- one rollout batch -------------------------------------------------
    def step(self, groups: list[Group]) -> dict[str, float]:
        start = time.perf_counter()
        batch = collate(flatten(groups), self.pad_id, self.device)
        old_logprobs = self._over_shares(self._old_logprobs, batch)
        ref_logprobs = self._over_shares(self._ref_logprobs, batch)
        advantages, masks, extra = self._advantages(batch, old_logprobs, ref_logprobs)
        metrics: dict[str, float] = {}
        counts: dict[str, int] = {}  # updates that logged each metric (a staleness bucket may miss some)
        updates = 0
        by_staleness = self._grad_norm_by_staleness(batch)
        warming_up = self.critics is not None and self.steps < self.algo.critic.warmup_steps
        for _ in range(0 if warming_up else self.cfg.epochs):
            # From the CPU generator, whose state checkpoints save: the same order on any device.
            order = torch.randperm(len(batch), device="cpu").to(self.device)
            order = self.dp.broadcast(order)  # ranks' RNGs drift apart (dropout): rank 0's order for all
            for rows in order.chunk(self.cfg.mini_batches):
                m = self._update(
                    batch.select(rows), advantages[rows], old_logprobs, ref_logprobs, rows,
                    masks[0][rows] if masks is not None else None,
                    masks[1][rows] if masks is not None else None, by_staleness,
                )
                for k, v in m.items():
                    metrics[k] = metrics.get(k, 0.0) + v
                    counts[k] = counts.get(k, 0) + 1
                updates += 1
        metrics = {k: v / counts[k] for k, v in metrics.items()}
        metrics.update(extra)
        staleness = (self.version - batch.versions).float()
        self.steps += 1
        if updates:  # a version is a set of weights: critic warm-up steps leave it unchanged
            self.version += 1
            self._update_credit_weights()
        if self.kl_control is not None and "train/kl_ref" in metrics:
            metrics["train/kl_coef"] = self.kl_control.update(metrics["train/kl_ref"], len(batch))
        metrics["train/lr"] = self.scheduler.get_last_lr()[0]
        metrics["train/seconds"] = time.perf_counter() - start
        metrics["train/staleness_mean"] = float(staleness.mean())
        metrics["train/staleness_max"] = float(staleness.max())
        return metrics

    def _advantages(
        self, batch: TrainBatch, old: torch.Tensor | None, ref: torch.Tensor | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None, dict[str, float]]:
        """Token advantages, AsyPPO's (advantage, entropy) masks and what to log about them.

        rewards (+ KL shaping) -> [critics' mean value -> GAE] -> [AsyPPO masks from the
        critics' disagreement] -> [attention-rhythm credit] -> advantages
        """
        metrics: dict[str, float] = {}
        # Per-turn estimators (gae, turn_grpo) see each episode turn's reward on its last token.
        token_rewards = batch.token_rewards if advantage_spec(self.algo.advantage).per_turn else None
        if ref is not None and self.algo.kl.mode == "reward":
            # KL as reward shaping penalises, per token, pi_old's drift from pi_ref: the policy
            # being improved, whatever version sampled the tokens (`_needs_old_logprobs`).
            token_rewards = shape_token_rewards(
                batch.rewards, batch.mask, old, ref, self.algo.kl, token_rewards=batch.token_rewards
            )
        values = sigma = None
        if self.critics is not None:
            all_values = self._over_shares(self.critics.values, batch, dim=1)  # [M, B, T]
            values, sigma = aggregate_values(all_values)
        out = compute_advantages(
            self.algo, batch.rewards, batch.group_ids, batch.mask, values=values, token_rewards=token_rewards
        )
        advantages, masks = out.advantages, None
        if self.critics is not None:
            metrics.update(self.critics.update(batch, out.returns, all_values))
            metrics["critic/parameters"] = float(self._critic_params)
            metrics["critic/train_state_mib"] = self._critic_params * 16 / 2**20
            metrics["critic/disagreement"] = float((sigma * batch.mask).sum() / batch.mask.sum().clamp(min=1))
            crit = self.algo.critic
            if self.critics.num_critics > 1 and (crit.adv_mask_low > 0 or crit.entropy_mask_high > 0):
                adv_mask, entropy_mask = uncertainty_masks(
                    sigma, batch.mask, crit.adv_mask_low, crit.entropy_mask_high, crit.quantile_scope
                )
                masks = (adv_mask, entropy_mask)  # applied by the loss (asyppo_objective_terms)
                valid = batch.mask.sum().clamp(min=1)
                metrics["asyppo/adv_masked_fraction"] = float(((1 - adv_mask) * batch.mask).sum() / valid)
                metrics["asyppo/entropy_masked_fraction"] = float(((1 - entropy_mask) * batch.mask).sum() / valid)
        if self.credit is not None:
            gammas, rhythm_metrics = self._gammas(batch)
            advantages = shape_advantages(advantages, gammas, batch.mask, self.algo.rhythm.both_signs)
            metrics.update(rhythm_metrics)
        return advantages, masks, metrics

    # -- data parallel ---------------------------------------------------------
    def _over_shares(self, fn, batch: TrainBatch, dim: int = 0) -> torch.Tensor | None:
        """A row-wise pass over the batch: on each rank's share, gathered into the whole batch's."""
        rows = self.dp.rows(torch.arange(len(batch), device=self.device), batch.attention_mask.sum(1))
        local = fn(batch.select(rows))
        return None if local is None else self.dp.gather_rows(local, rows, len(batch), dim)

    def _gammas(self, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """Attention-rhythm gammas for the batch; with data parallelism each rank reads the
        attention of its own share."""
        seconds = 0.0

        def local(part: TrainBatch) -> torch.Tensor:
            nonlocal seconds
            gammas, metrics = self.credit.gammas(part)
            seconds = metrics["rhythm/attention_seconds"]
            return gammas

        gammas = self._over_shares(local, batch)
        return gammas, {**credit_metrics(gammas, batch.mask), "rhythm/attention_seconds": seconds}

    def _update_credit_weights(self) -> None:
        """actor_attn follows the policy's weights (full ones: each rank's copy is whole)."""
        if self.credit is not None:
            weights = merged_state_dict(self.model) if self.lora else self.dp.full_state_dict(self.policy, everywhere=True)
            self.credit.update_weights(weights, self.version)

    def weights(self) -> dict[str, torch.Tensor]:
        """The policy's full weights for the engines, on CPU (data parallel: a collective; rank 0's
        are whole, the other ranks get an empty dict). LoRA: the adapters merged into the base
        weights, under the plain model's names."""
        if self.lora:
            return to_cpu(merged_state_dict(self.model))
        return self.dp.full_state_dict(self.policy)

    @contextlib.contextmanager
    def _base_only(self) -> Iterator[None]:
        """LoRA: the policy computes as its base model (adapters off, eval mode) inside; otherwise
        nothing changes."""
        if not self.lora:
            yield
            return
        self.model.eval()
        try:
            with self.model.disable_adapter():
                yield
        finally:
            self.model.train()

    def _autocast(self) -> contextlib.AbstractContextManager:
        """bfloat16 matmuls in the forward passes (trainer.bf16_autocast); logits are cast back to
        float32 by `forward_logits` before any log-softmax."""
        if not self.cfg.bf16_autocast:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def _why_not_by_staleness(self) -> str | None:
        """Why the gradient cannot be split by staleness bucket in this run (None: it can)."""
        if self.dp.world > 1:
            return "not measured with data parallelism (a rank's gradient is its own until the last micro-batch)"
        if self.algo.mismatch.mode == "m2po":
            return "M2PO's mask is computed over each micro-batch, so grouping them by staleness would change it"
        return None

    def _grad_norm_by_staleness(self, batch: TrainBatch) -> bool:
        """Whether this step's updates run their micro-batches bucket by bucket and log each
        bucket's gradient norm (trainer.grad_norm_by_staleness)."""
        mode = self.cfg.grad_norm_by_staleness
        if mode == "off" or self._why_not_by_staleness():
            return False
        if mode == "on":
            return True
        sampled = (self.steps + 1) % self.cfg.grad_norm_by_staleness_every == 0  # steps 10, 20, ...: a diagnostic
        return sampled and bool((batch.versions < self.version).any())

    def _needs_old_logprobs(self, batch: TrainBatch) -> bool:
        """pi_old is the policy at the start of this step. With one update per batch that is
        the policy of the update itself, so the training forward's detached log-probs are pi_old
        exactly, stale samples included (their off-policy weight pi_old / mu uses the engine's
        mu); only repeated updates need pi_old frozen by a separate pass."""
        if self.cfg.recompute_old_logprobs == "always":
            return True
        if self.reference is not None and self.algo.kl.mode == "reward":
            return True  # the KL reward is computed before any update, from pi_old
        return self.cfg.epochs > 1 or self.cfg.mini_batches > 1

    def _old_logprobs(self, batch: TrainBatch) -> torch.Tensor | None:
        """pi_old for the ratio; None means "pi_theta itself, detached"."""
        if not self._needs_old_logprobs(batch):
            return None
        self.policy.eval()  # dropout off: pi_old must be a deterministic function of the weights
        with self._autocast():
            old = batched_logprobs(
                self.policy, batch.input_ids, batch.attention_mask, self.temperature, self.cfg.micro_batch_size,
                self.cfg.micro_batch_tokens, even=self.dp.even,
            )
        self.policy.train()
        return old

    def _ref_logprobs(self, batch: TrainBatch) -> torch.Tensor | None:
        if self.reference is None:
            return None
        with self._autocast(), self._base_only():
            return batched_logprobs(
                self.reference, batch.input_ids, batch.attention_mask, self.temperature, self.cfg.micro_batch_size,
                self.cfg.micro_batch_tokens,
            )

    def _update(
        self,
        mini: TrainBatch,
        advantages: torch.Tensor,
        old_all: torch.Tensor | None,
        ref_all: torch.Tensor | None,
        rows: torch.Tensor,
        adv_mask: torch.Tensor | None = None,
        entropy_mask: torch.Tensor | None = None,
        by_staleness: bool = False,
    ) -> dict[str, float]:
        """One optimizer update over a mini-batch, accumulated over micro-batches (`by_staleness`:
        bucket by bucket, logging the norm of each bucket's part of the gradient)."""
        self.optimizer.zero_grad(set_to_none=True)
        # This rank's share of the mini-batch, over the whole mini-batch's denominators.
        share = self.dp.rows(torch.arange(len(mini), device=self.device), mini.attention_mask.sum(1))
        mini, advantages, rows = mini.select(share), advantages[share], rows[share]
        adv_mask = adv_mask[share] if adv_mask is not None else None
        entropy_mask = entropy_mask[share] if entropy_mask is not None else None
        tokens, seqs = self.dp.denominators(mini.mask)
        sums: dict[str, float] = {}
        # Similar lengths share a micro-batch (less padding); the loss is a sum over
        # micro-batches with mini-batch denominators, so the grouping cannot change it.
        lengths = mini.attention_mask.sum(1)
        bucket_ends: dict[int, str] = {}  # index of a bucket's last micro-batch -> the bucket
        if by_staleness:
            parts = []
            for bucket, bucket_parts in bucketed_micro_batches(
                lengths, self.version - mini.versions, self.cfg.micro_batch_size, self.cfg.micro_batch_tokens
            ):
                parts += bucket_parts
                bucket_ends[len(parts) - 1] = bucket
        else:
            parts = micro_batches(lengths, self.cfg.micro_batch_size, self.cfg.micro_batch_tokens)
        parts, real = self.dp.even(parts)
        added = GradientAdded([p for p in self.policy.parameters() if p.requires_grad])
        bucket_norms: dict[str, float] = {}
        for n, idx in enumerate(parts):
            part = mini.select(idx).trimmed()
            sel = rows[idx]
            width = part.mask.shape[1]
            with self._autocast():
                logits = forward_logits(self.policy, part.input_ids, part.attention_mask)
            logprobs = token_logprobs(logits, part.input_ids, self.temperature)
            # The entropy only carries gradient when it is part of the objective.
            entropy = token_entropy(logits if self.algo.entropy_coef > 0 else logits.detach(), self.temperature)
            out = compute_policy_loss(
                PolicyLossInputs(
                    logprobs=logprobs,
                    old_logprobs=old_all[sel, :width] if old_all is not None else logprobs.detach(),
                    behaviour_logprobs=part.behaviour_logprobs,
                    advantages=advantages[idx, :width],
                    mask=part.mask,
                    sequence_rewards=part.rewards,
                    ref_logprobs=ref_all[sel, :width] if ref_all is not None and self.algo.kl.mode == "loss" else None,
                    entropy=entropy,
                    adv_mask=adv_mask[idx, :width] if adv_mask is not None else None,
                    entropy_mask=entropy_mask[idx, :width] if entropy_mask is not None else None,
                ),
                self.algo,
                token_denominator=float(tokens),
                seq_denominator=float(seqs),
                kl_coef=self.kl_control.coef if self.kl_control is not None else None,
            )
            # DDP and FSDP average gradients over ranks; the world size undoes that, and a
            # padding micro-batch (n >= real, FSDP only) contributes nothing.
            with self.dp.grad_sync(self.policy, enabled=n == len(parts) - 1):
                (out.loss * (self.dp.world if n < real else 0.0)).backward()
            if n >= real:
                continue
            # Loss-like metrics are already normalised by the whole mini-batch, so they add up;
            # per-token averages (ratios, clip fractions) are weighted by the part's share.
            share = float(part.mask.sum()) / max(float(tokens), 1.0)
            for k, v in out.metrics.items():
                weight = 1.0 if k in ADDITIVE_METRICS else share
                key = k if "/" in k else f"train/{k}"  # offpolicy/* keep their own prefix
                sums[key] = sums.get(key, 0.0) + v * weight
            if n in bucket_ends:
                norm = added.norm_since_last(keep=n < len(parts) - 1)
                bucket_norms[f"offpolicy/grad_norm_stale_{bucket_ends[n]}"] = norm
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        sums = self.dp.sum_metrics(sums)  # each rank's sums cover its share: together, the mini-batch's
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP's DTensor
        sums["train/grad_norm"] = float(grad_norm)
        return {**sums, **bucket_norms}

    # -- state for checkpoints ----------------------------------------------
    def state_dict(self) -> dict:
        """On CPU, so a checkpoint loads on any machine; loading casts it back to the parameters' device."""
        state = {"version": self.version, "steps": self.steps, "scheduler": self.scheduler.state_dict()}
        if self.kl_control is not None:  # adaptive KL: the coefficient is trainer state, never config
            state["kl_coef"] = self.kl_control.coef
        optimizer = self.dp.optimizer_state(self.optimizer)  # data parallel: None, its shards go to `save`
        if optimizer is not None:
            state["optimizer"] = optimizer
        if self.critics is not None:
            state["critics"] = self.critics.state_dict()
        if self.lora:  # the trained weights: the base ones never change
            state["adapter"] = adapter_state(self.model)
        return to_cpu(state)

    def save(self, folder: Path) -> None:
        """Into the checkpoint `folder`, what `state_dict` leaves out: a data-parallel rank's shard
        of weights and optimizer state; nothing for a trainer alone in its process."""
        self.dp.save_shards(self.policy, self.optimizer, folder)

    def close(self) -> None:
        """Nothing to release: this trainer lives in this process (`Trainer` protocol)."""

    def load_state_dict(self, state: dict, folder: Path | None = None) -> None:
        """`state` from `state_dict`; `folder` is the checkpoint, read when its optimizer state
        is sharded (a data-parallel run's). Any rank count resumes any other's checkpoint."""
        self.version = int(state["version"])
        if self.lora:
            load_adapter_state(self.model, state["adapter"])
        self.steps = int(state.get("steps", self.version))  # older checkpoints: no warm-up steps
        if "optimizer" not in state:
            if folder is None:
                raise ValueError("this checkpoint's optimizer state is sharded: pass its folder")
            load_sharded(self.policy, self.optimizer, folder)
        else:
            self.dp.load_optimizer(self.policy, self.model, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.kl_control is not None and "kl_coef" in state:
            self.kl_control.coef = float(state["kl_coef"])
        if self.critics is not None:
            self.critics.load_state_dict(state["critics"])
        self._update_credit_weights()
