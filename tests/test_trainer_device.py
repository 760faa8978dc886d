"""trainer.device: everything a step builds lives on the trainer's device.

There is no GPU here, so a forgotten `.to(device)` is invisible on CPU. Two
checks make it visible anyway:
- placement on the "meta" device: a trainer built for meta must hold every
  module (policy, KL reference, critics, actor_attn) there, and `collate` must
  hand back a meta batch; whatever stayed on CPU was not moved;
- an audit of a real CPU step: a TorchFunctionMode sees every tensor factory
  (torch.zeros, torch.tensor, torch.arange, ...) that cadence code calls during
  the step and reports those that name no device. On a GPU such a tensor would be
  on CPU beside CUDA ones (a device-mismatch error, or NCCL refusing a CPU tensor).
  Factories that draw from a generator take its device, so they pass.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

import cadence
from cadence.algo.config import AlgorithmConfig
from cadence.config import ConfigError, TrainerConfig, load_config
from cadence.models.tiny import tiny_model
from cadence.runtime.trainer_group import free_port
from cadence.train.batch import collate, flatten
from cadence.train.credit import AttentionCredit
from cadence.train.critics import CriticEnsemble
from cadence.train.data_parallel import DataParallel
from cadence.train.device import resolve_device
from cadence.train.resume import check_resume_config
from cadence.train.trainer import PolicyTrainer
from tests.test_dp_trainer import MODEL, make_groups

CADENCE = str(Path(cadence.__file__).parent)
FACTORIES = {
    torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.full, torch.empty, torch.arange,
    torch.randperm, torch.rand, torch.randn, torch.randint, torch.linspace, torch.eye,
}


class DeviceAudit(TorchFunctionMode):
    """Records cadence's device-less tensor factories, and the devices of every op's result."""

    def __init__(self) -> None:
        super().__init__()
        self.unplaced: list[str] = []
        self.devices: set[torch.device] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and "device" not in kwargs and "generator" not in kwargs:
            caller = sys._getframe(1)  # the Python code that called the factory
            if caller.f_code.co_filename.startswith(CADENCE):
                where = Path(caller.f_code.co_filename).relative_to(Path(CADENCE).parent)
                self.unplaced.append(f"{where}:{caller.f_lineno} torch.{func.__name__}")
        out = func(*args, **kwargs)
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.devices.add(t.device)
        return out


def critic_credit_trainer(cfg: TrainerConfig, dp: DataParallel | None = None) -> PolicyTrainer:
    """Everything the trainer can hold: KL reference, AsyPPO's two critics, rhythm credit, pi_old."""
    algo = AlgorithmConfig(name="asyppo", credit="local", critic={"warmup_steps": 0}, kl={"coef": 0.1})
    torch.manual_seed(0)
    model = tiny_model(**MODEL).train()
    critics = CriticEnsemble(algo.critic, model, "", 0, 2)
    credit = AttentionCredit(model, algo.credit, algo.rhythm, pad_id=0)
    return PolicyTrainer(model, cfg, algo, 1.0, 0, critics=critics, credit=credit, dp=dp)


def audited_step(trainer: PolicyTrainer) -> DeviceAudit:
    audit = DeviceAudit()
    with audit:
        metrics = trainer.step(make_groups(0))
    assert all(type(v) is float for v in metrics.values()), metrics  # metrics come back as Python floats
    return audit


def test_a_meta_trainer_holds_every_module_and_batch_on_meta():
    # meta is no config value: model_copy skips validation, so the trainer places everything there.
    cfg = TrainerConfig(micro_batch_size=2).model_copy(update={"device": "meta"})
    trainer = critic_credit_trainer(cfg)
    modules = {
        "policy": trainer.model, "reference": trainer.reference, "actor_attn": trainer.credit.actor_attn.model,
        **{f"critic {m}": c for m, c in enumerate(trainer.critics.critics)},
    }
    for name, module in modules.items():
        off = {n for n, t in [*module.named_parameters(), *module.named_buffers()] if t.device.type != "meta"}
        assert not off, f"{name}: {sorted(off)[:3]} not on the trainer's device"
    batch = collate(flatten(make_groups(0)), 0, trainer.device)
    assert {f: t.device.type for f, t in vars(batch).items()} == {f: "meta" for f in vars(batch)}


@pytest.mark.parametrize("epochs", [1, 2])  # 2: pi_old by a no-grad pass, shuffled mini-batches
def test_a_step_builds_no_tensor_off_the_trainers_device(epochs):
    trainer = critic_credit_trainer(TrainerConfig(device="cpu", micro_batch_size=2, epochs=epochs, mini_batches=2))
    audit = audited_step(trainer)
    assert not audit.unplaced, "\n".join(audit.unplaced)
    assert audit.devices == {torch.device("cpu")}
    assert trainer.version == 1


@pytest.fixture
def one_rank_group():
    """A real one-rank gloo group in this process: the data-parallel code paths, collectives included."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_data_parallel_step_builds_no_tensor_off_the_ranks_device(one_rank_group, strategy):
    cfg = TrainerConfig(micro_batch_size=2, strategy=strategy, epochs=2)
    trainer = critic_credit_trainer(cfg, DataParallel(0, 1, strategy, device=resolve_device("cpu")))
    audit = audited_step(trainer)
    assert not audit.unplaced, "\n".join(audit.unplaced)
    assert all(t.device.type == "cpu" for t in trainer.weights().values())


def test_cuda_without_a_gpu_is_a_config_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"trainer\.device: .*set trainer\.device=cpu or auto"):
        load_config(None, ["trainer.device=cuda"])
    assert resolve_device(load_config(None, []).trainer.device) == torch.device("cpu")  # auto


def test_inline_cuda_ranks_need_a_gpu_each(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"trainer_workers=2 with trainer\.device=auto needs a GPU per rank"):
        load_config(None, ["runtime.trainer_workers=2"])
    assert load_config(None, ["runtime.trainer_workers=2", "trainer.device=cpu"]).trainer.device == "cpu"


def test_a_gpu_run_resumes_on_cpu_without_allow_change():
    """Checkpoint state is on CPU whatever the device, so the device is free to change on resume."""
    saved, now = {"trainer": {"device": "cuda", "lr": 1}}, {"trainer": {"device": "cpu", "lr": 1}}
    assert check_resume_config(saved, now, [], "step_2") == {}


def test_bf16_autocast_runs_the_policy_and_reference_forwards_in_bfloat16():
    runs = {}
    for autocast in (False, True):
        trainer = critic_credit_trainer(TrainerConfig(device="cpu", micro_batch_size=2, epochs=2, bf16_autocast=autocast))
        seen: set[torch.dtype] = set()
        for model in (trainer.model, trainer.reference):  # the training forward, pi_old, pi_ref
            model.lm_head.register_forward_hook(lambda module, args, out, seen=seen: seen.add(out.dtype))
        metrics = trainer.step(make_groups(0))
        assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}  # weights stay float32
        runs[autocast] = (seen, metrics)
    assert runs[False][0] == {torch.float32} and runs[True][0] == {torch.bfloat16}
    for key in ("train/loss", "train/grad_norm"):  # bfloat16 rounding, not a different objective
        assert runs[True][1][key] == pytest.approx(runs[False][1][key], rel=1e-2), key
