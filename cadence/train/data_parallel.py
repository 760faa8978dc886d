"""One data-parallel trainer rank's side of its torch.distributed group.

Every rank gets the whole rollout batch, computes the batch-level quantities
that must see every sample (group-normalised advantages, GAE over the
critics' values) identically, and trains on its token-balanced share of each
mini-batch (`cadence.train.shard`). The gradient is then the one-rank
gradient exactly, up to float summation order:

    loss_r = sum_{i in share r} l_i / D,   D = all_reduce_sum(local denominators)
    grad   = sum_r grad loss_r             (DDP / FSDP average over ranks, so each
                                            rank's loss is scaled by the world size)

Row-wise passes (pi_old, pi_ref, critic values, attention-rhythm gammas) run on
each rank's share and are gathered back into full-batch tensors.

strategy=ddp wraps the policy in DistributedDataParallel; strategy=fsdp shards
it with FSDP2 (`fully_shard` on every decoder layer, then the root, over a 1-D
device mesh of the rank's device type), optionally keeping parameters and
optimizer state in CPU memory. FSDP runs collectives in every forward, so all
ranks run the same number of micro-batches (a rank with fewer repeats one with
zero loss weight). Collectives take tensors on the rank's device (NCCL moves
only GPU memory), so every tensor built here is made there.

`SingleProcess` is the same interface for a trainer alone in its process (no
torch.distributed): the whole batch is its share and every collective is the
identity, so the trainer has one code path and a one-process step computes
exactly what it computed before data parallelism existed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

import torch
import torch.distributed as dist
from torch import Tensor, nn

from cadence.algo.aggregation import batch_denominators
from cadence.train.checkpoint import load_full_optimizer, save_sharded
from cadence.train.device import to_cpu
from cadence.train.shard import rank_rows

Strategy = Literal["ddp", "fsdp"]


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks FSDP shards one by one: modules whose class the model names in
    `_no_split_modules` (Hugging Face's list of blocks that must stay whole)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    return [m for m in model.modules() if type(m).__name__ in names]


class DataParallel:
    """Rank `rank` of `world` in the default process group, computing on `device`."""

    def __init__(
        self, rank: int, world: int, strategy: Strategy = "ddp", cpu_offload: bool = False,
        device: torch.device | str = "cpu",
    ) -> None:
        self.rank, self.world = rank, world
        self.device = torch.device(device)
        self.strategy = strategy
        self.cpu_offload = cpu_offload

    # -- the model ------------------------------------------------------------
    def wrap(self, model: nn.Module) -> nn.Module:
        """DDP wrapper of the model moved to this rank's device, or the same module sharded in
        place by FSDP2 (which moves each rank's shard itself: no whole copy on one GPU)."""
        if self.strategy == "ddp":
            # The buffers (rotary frequencies) never change: no per-forward broadcast.
            ids = [self.device] if self.device.type == "cuda" else None
            return nn.parallel.DistributedDataParallel(model.to(self.device), device_ids=ids, broadcast_buffers=False)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

        layers = decoder_layers(model)
        if not layers:
            raise ValueError(
                f"trainer.strategy=fsdp: no decoder layers found in {type(model).__name__} "
                "(its _no_split_modules names none); use trainer.strategy=ddp"
            )
        # Pinned host memory speeds copies to a GPU; a CPU-only run has none to pin (nor to copy to).
        policy = CPUOffloadPolicy(pin_memory=self.device.type == "cuda") if self.cpu_offload else OffloadPolicy()
        # Named, not left to FSDP's default (the machine's accelerator): a CPU trainer on a GPU box.
        mesh = init_device_mesh(self.device.type, (self.world,))
        for layer in layers:
            fully_shard(layer, mesh=mesh, offload_policy=policy)
        fully_shard(model, mesh=mesh, offload_policy=policy)
        return model

    @contextlib.contextmanager
    def grad_sync(self, model: nn.Module, enabled: bool) -> Iterator[None]:
        """Reduce gradients over ranks in this backward only when `enabled` (the last micro-batch)."""
        if self.strategy == "ddp":
            with contextlib.nullcontext() if enabled else model.no_sync():
                yield
            return
        model.set_requires_gradient_sync(enabled)
        yield

    def even(self, parts: list[Tensor]) -> tuple[list[Tensor], int]:
        """`parts` padded (by repeating the first) to the most micro-batches any rank has; and
        how many are real. Needed by FSDP, whose forwards are collectives."""
        real = len(parts)
        if self.strategy == "ddp":
            return parts, real
        most = int(self.all_sum(torch.tensor([real], device=self.device), op=dist.ReduceOp.MAX)[0])
        return parts + [parts[0]] * (most - real), real

    def full_state_dict(self, model: nn.Module, everywhere: bool = False) -> dict[str, Tensor]:
        """Full (unsharded) CPU weights with the plain model's names; only rank 0 gets them
        unless `everywhere`. A collective: every rank calls it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=not everywhere)
        state = get_model_state_dict(model, options=opts)
        return {k: v.detach().cpu() for k, v in state.items()}

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict | None:
        """The optimizer state a checkpoint's trainer state holds: none here, each rank's shard goes
        to `save_shards`."""
        return None

    def save_shards(self, model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
        """What the trainer state leaves out: this rank's shard of weights and optimizer state,
        written under the checkpoint `folder` (a collective: every rank calls it)."""
        save_sharded(model, optimizer, folder)

    def load_optimizer(
        self, model: nn.Module, plain: nn.Module, optimizer: torch.optim.Optimizer, state: dict
    ) -> None:
        """A one-process optimizer state (a checkpoint's) into this rank's optimizer of `model`
        (wrapped; `plain` is the module before wrapping, whose parameter names the state follows)."""
        load_full_optimizer(model, plain, optimizer, state)

    # -- the batch ------------------------------------------------------------
    def rows(self, rows: Tensor, lengths: Tensor) -> Tensor:
        """This rank's token-balanced share of `rows` (lengths indexed by the entries of `rows`)."""
        return rank_rows(rows, lengths, self.rank, self.world)

    def gather_rows(self, local: Tensor, rows: Tensor, size: int, dim: int = 0) -> Tensor:
        """Each rank's rows of a tensor (`local`, rows `rows` along `dim`) -> the full tensor
        on every rank. Zero-filled and summed: adding zeros is exact."""
        shape = list(local.shape)
        shape[dim] = size
        full = local.new_zeros(shape)
        full.index_copy_(dim, rows, local)
        return self.all_sum(full)

    def denominators(self, mask: Tensor) -> tuple[float, float]:
        """Global (tokens, sequences) of a mini-batch from this rank's share's mask."""
        counts = torch.stack([mask.sum().double(), (mask.sum(-1) > 0).sum().double()])
        tokens, seqs = self.all_sum(counts).tolist()
        return tokens, seqs

    # -- collectives ------------------------------------------------------------
    def all_sum(self, t: Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM) -> Tensor:
        dist.all_reduce(t, op=op)
        return t

    def broadcast(self, t: Tensor) -> Tensor:
        dist.broadcast(t, src=0)
        return t

    def sum_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Each metric summed over ranks (the trainer pre-weights them so sums are the batch's)."""
        keys = sorted(metrics)
        values = self.all_sum(torch.tensor([metrics[k] for k in keys], dtype=torch.float64, device=self.device))
        return dict(zip(keys, values.tolist(), strict=True))

    def reduce_grads(self, params: Iterable[nn.Parameter]) -> None:
        """Sum gradients over ranks (replicated modules: the critics); absent ones count as 0."""
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)


class SingleProcess(DataParallel):
    """A trainer alone in its process: rank 0 of 1 without torch.distributed. The whole batch is
    its share, the model is used as it is, and every collective returns its input."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        super().__init__(0, 1, "ddp", device=device)

    def wrap(self, model: nn.Module) -> nn.Module:
        return model.to(self.device)

    @contextlib.contextmanager
    def grad_sync(self, model: nn.Module, enabled: bool) -> Iterator[None]:
        yield

    def even(self, parts: list[Tensor]) -> tuple[list[Tensor], int]:
        return parts, len(parts)

    def full_state_dict(self, model: nn.Module, everywhere: bool = False) -> dict[str, Tensor]:
        """The model's own weights for use in this process (`everywhere`: on its device, no copy),
        else on CPU for what leaves the trainer."""
        return model.state_dict() if everywhere else to_cpu(model.state_dict())

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict | None:
        return optimizer.state_dict()

    def save_shards(self, model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
        """Nothing: the whole optimizer state is in the trainer state (`optimizer_state`)."""

    def load_optimizer(
        self, model: nn.Module, plain: nn.Module, optimizer: torch.optim.Optimizer, state: dict
    ) -> None:
        optimizer.load_state_dict(state)

    def rows(self, rows: Tensor, lengths: Tensor) -> Tensor:
        return rows

    def gather_rows(self, local: Tensor, rows: Tensor, size: int, dim: int = 0) -> Tensor:
        return local

    def denominators(self, mask: Tensor) -> tuple[float, float]:
        return batch_denominators(mask)

    def all_sum(self, t: Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM) -> Tensor:
        return t

    def broadcast(self, t: Tensor) -> Tensor:
        return t

    def sum_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        return metrics

    def reduce_grads(self, params: Iterable[nn.Parameter]) -> None:
        return None
