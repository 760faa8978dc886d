"""Data-parallel trainer: N ranks (spawned processes, gloo) match one rank on the same batch.

The ranks are real: `TrainerGroup` spawns them, they join one torch.distributed
group and run `PolicyTrainer` with DDP or FSDP2; the one-rank reference is the
plain in-process `PolicyTrainer`.
"""

from __future__ import annotations

import copy
import functools
import inspect
import os
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.models.llama.modeling_llama import LlamaPreTrainedModel

from cadence.algo.aggregation import MODES, aggregate, batch_denominators
from cadence.algo.config import AlgorithmConfig
from cadence.config import ConfigError, RuntimeConfig, TrainerConfig, load_config
from cadence.models.tiny import tiny_model
from cadence.rollout.sample import Group, Sample
from cadence.runtime.trainer_group import TrainerGroup
from cadence.train.credit import AttentionCredit
from cadence.train.critics import CriticEnsemble
from cadence.train.data_parallel import DataParallel, SingleProcess
from cadence.train.protocol import Trainer
from cadence.train.shard import rank_rows, token_balanced_bins
from cadence.train.trainer import PolicyTrainer

MODEL = dict(hidden_size=32, layers=2, heads=2)


def make_groups(step: int) -> list[Group]:
    """Three prompts of four responses with varied lengths and rewards (differs per step)."""
    gen = torch.Generator().manual_seed(step)
    groups = []
    for gid in range(3):
        g = Group(group_id=gid, prompt_id=str(gid))
        prompt = torch.randint(4, 200, (2 + gid,), generator=gen).tolist()
        for j in range(4):
            n = int(torch.randint(1, 9, (1,), generator=gen))
            resp = torch.randint(4, 200, (n,), generator=gen).tolist()
            reward = float(torch.rand(1, generator=gen) > 0.5)
            g.samples.append(Sample(str(gid), gid, prompt, resp, [-1.0] * n, reward, 0, "stop", f"r{j}"))
        groups.append(g)
    return groups


def build_trainer(
    trainer_cfg: TrainerConfig, algo: AlgorithmConfig, dp: DataParallel | None = None, weights: str | None = None
) -> PolicyTrainer:
    """The same tiny policy on every rank (and in the one-process reference); `weights`: a
    saved checkpoint folder to start from instead."""
    torch.manual_seed(0)
    model = tiny_model(**MODEL) if weights is None else AutoModelForCausalLM.from_pretrained(weights)
    return PolicyTrainer(model.train(), trainer_cfg, algo, 1.0, 0, dp=dp)


def start_group(trainer_cfg: TrainerConfig, algo: AlgorithmConfig, weights: str | None = None) -> TrainerGroup:
    build = functools.partial(build_trainer, trainer_cfg, algo, weights=weights)
    return TrainerGroup(build, trainer_cfg, RuntimeConfig(trainer_workers=2))


def steps(trainer: PolicyTrainer | TrainerGroup, first: int, last: int) -> list[dict[str, float]]:
    return [trainer.step(make_groups(s)) for s in range(first, last)]


def assert_same_metrics(a: list[dict], b: list[dict]) -> None:
    for key in ("train/loss", "train/grad_norm", "train/pg_loss"):
        assert [m[key] for m in b] == pytest.approx([m[key] for m in a], rel=1e-5, abs=1e-7), key


def assert_same_weights(a: dict, b: dict, start: dict | None = None) -> None:
    """Equal up to float summation order (Adam divides by sqrt(v) and so magnifies it a little);
    and the steps really moved them far more than that."""
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=2e-5, rtol=0), (k, float((a[k] - b[k]).abs().max()))
    if start is not None:
        assert max(float((a[k] - start[k]).abs().max()) for k in a) > 1e-3


def parameters(cls: type) -> dict[str, list[tuple]]:
    """The `Trainer` protocol's methods as `cls` has them: each one's (name, kind, default) parameters."""
    methods = [name for name, member in vars(Trainer).items() if inspect.isfunction(member) and name[0] != "_"]
    return {name: [(p.name, p.kind, p.default) for p in inspect.signature(getattr(cls, name)).parameters.values()]
            for name in methods}


def assert_is_a_trainer(trainer: object) -> None:
    """What the training loop asks of a trainer (`Trainer`), asked the same way."""
    assert [a for a in Trainer.__annotations__ if not hasattr(trainer, a)] == []
    assert parameters(type(trainer)) == parameters(Trainer)


def test_a_trainer_alone_is_rank_0_of_1_whose_collectives_return_their_input(tmp_path):
    """The default `dp` (no torch.distributed): the whole batch is its share, collectives are
    identities, and its checkpoint state carries the whole optimizer (resumable as is): it saves
    nothing more into a checkpoint. One rank and many are one `Trainer`."""
    dp = SingleProcess()
    rows, t = torch.tensor([2, 0, 1]), torch.tensor([1.5, -2.0])
    assert dp.rows(rows, torch.tensor([5, 1, 9])) is rows
    assert dp.gather_rows(t, rows, 3) is t and dp.all_sum(t) is t and dp.broadcast(t) is t
    assert dp.sum_metrics({"a": 1.0}) == {"a": 1.0} and dp.even([rows]) == ([rows], 1)
    assert dp.denominators(torch.tensor([[1.0, 1.0], [0.0, 0.0]])) == (2.0, 1.0)
    trainer = build_trainer(TrainerConfig(micro_batch_size=2), AlgorithmConfig())
    assert isinstance(trainer.dp, SingleProcess) and trainer.policy is trainer.model
    assert not torch.distributed.is_initialized()
    assert_is_a_trainer(trainer)
    assert parameters(TrainerGroup) == parameters(Trainer)
    steps(trainer, 0, 1)
    state = copy.deepcopy(trainer.state_dict())  # CPU tensors are handed over as they are, not copied
    assert "optimizer" in state
    trainer.save(tmp_path)
    assert list(tmp_path.iterdir()) == []
    resumed = build_trainer(TrainerConfig(micro_batch_size=2), AlgorithmConfig())
    resumed.model.load_state_dict(trainer.weights())
    resumed.load_state_dict(state)
    torch.manual_seed(1)  # the mini-batch order
    continued = steps(trainer, 1, 3)
    torch.manual_seed(1)
    assert_same_metrics(continued, steps(resumed, 1, 3))


def test_token_balanced_bins_by_hand():
    # Longest first, each to the lightest bin: 9->A, 7->B, 5->B(7<9), 4->A(9<12), 3->B(12<13), 1->A.
    lengths = torch.tensor([3, 9, 1, 5, 7, 4])
    bins = token_balanced_bins(lengths, 2)
    assert [b.tolist() for b in bins] == [[1, 2, 5], [0, 3, 4]]
    assert [int(lengths[b].sum()) for b in bins] == [14, 15]
    assert [b.tolist() for b in token_balanced_bins(torch.tensor([2, 2, 2]), 3)] == [[0], [1], [2]]
    # rank_rows picks from a subset of rows, balanced by those rows' lengths.
    rows = torch.tensor([5, 1, 4])  # lengths 4, 9, 7
    assert rank_rows(rows, lengths, 0, 2).tolist() == [1] and rank_rows(rows, lengths, 1, 2).tolist() == [5, 4]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_match_one_rank_after_three_steps(strategy):
    cfg = TrainerConfig(lr=1e-2, micro_batch_size=2, micro_batch_tokens=None, strategy=strategy)
    algo = AlgorithmConfig()
    single = build_trainer(cfg, algo)
    start = copy.deepcopy(single.policy.state_dict())
    metrics_1 = steps(single, 0, 3)
    group = start_group(cfg, algo)
    try:
        assert_is_a_trainer(group)
        metrics_2 = steps(group, 0, 3)
        weights_2 = group.weights()
    finally:
        group.close()
    assert_same_metrics(metrics_1, metrics_2)
    assert_same_weights(single.policy.state_dict(), weights_2, start)


@pytest.mark.slow
def test_resume_across_rank_counts_matches_continuing(tmp_path):
    """1 rank -> checkpoint -> 2 FSDP ranks -> sharded checkpoint -> 1 rank: the weights after
    each resumed step are those of one uninterrupted run."""
    cfg = TrainerConfig(lr=1e-2, micro_batch_size=2, micro_batch_tokens=None, strategy="fsdp")
    algo = AlgorithmConfig()
    whole = build_trainer(cfg, algo)
    steps(whole, 0, 2)
    at_2 = copy.deepcopy(whole.policy.state_dict())
    state_2 = copy.deepcopy(whole.state_dict())
    whole.policy.save_pretrained(tmp_path / "step_2")
    steps(whole, 2, 3)
    at_3 = copy.deepcopy(whole.policy.state_dict())
    steps(whole, 3, 4)

    group = start_group(cfg, algo, weights=str(tmp_path / "step_2"))
    try:
        group.load_state_dict(state_2)  # a one-process optimizer state, sharded over two ranks
        steps(group, 2, 3)
        assert_same_weights(at_3, group.weights(), at_2)
        state_3 = group.state_dict()
        assert "optimizer" not in state_3  # its shards are in the folder
        group.save(tmp_path / "step_3")
    finally:
        group.close()

    resumed = build_trainer(cfg, algo, weights=str(tmp_path / "step_2"))  # weights come from the shards
    resumed.load_state_dict(state_3, tmp_path / "step_3")
    assert_same_weights(at_3, resumed.policy.state_dict())
    assert resumed.version == 3
    steps(resumed, 3, 4)
    assert_same_weights(whole.policy.state_dict(), resumed.policy.state_dict(), at_3)


class DenominatorProbe:
    """Stands in for a rank's trainer: its `state_dict` is the ranks' shares of a loss added up, in
    every aggregation mode, over global ("shared") and over each share's own ("local") denominators."""

    def __init__(self, per_token: torch.Tensor, mask: torch.Tensor, dp: DataParallel) -> None:
        self.per_token, self.mask, self.dp = per_token, mask, dp

    def state_dict(self) -> dict[str, dict[str, float]]:
        return {"shared": self.losses(True), "local": self.losses(False)}

    def losses(self, global_denominators: bool) -> dict[str, float]:
        per_token, mask = self.per_token, self.mask
        rows = self.dp.rows(torch.arange(len(mask)), mask.sum(1))
        tokens, seqs = self.dp.denominators(mask[rows]) if global_denominators else batch_denominators(mask[rows])
        local = {
            mode: aggregate(per_token[rows], mask[rows], mode, tokens, seqs, norm_length=8.0) for mode in MODES
        }
        return self.dp.sum_metrics({mode: float(v) for mode, v in local.items()})


@pytest.mark.slow
def test_global_denominators_for_every_aggregation_mode():
    """Each rank aggregates its share over the all-reduced (tokens, sequences): the ranks' losses
    add up to the one-rank loss in every mode; over each share's own counts they do not."""
    gen = torch.Generator().manual_seed(0)
    per_token = torch.randn(6, 9, generator=gen)
    lengths = torch.tensor([9, 2, 5, 7, 1, 4])
    mask = (torch.arange(9)[None, :] < lengths[:, None]).float()
    mask[4] = 0.0  # a sequence with no response token counts in no denominator
    probe = functools.partial(DenominatorProbe, per_token, mask)
    group = TrainerGroup(probe, TrainerConfig(), RuntimeConfig(trainer_workers=2))
    try:
        losses = group.state_dict()
    finally:
        group.close()
    shared, local = losses["shared"], losses["local"]
    for mode in MODES:
        whole = float(aggregate(per_token, mask, mode, norm_length=8.0))
        assert shared[mode] == pytest.approx(whole, rel=1e-6), mode
        assert local[mode] != pytest.approx(whole, rel=1e-3), mode  # local counts would be wrong


def build_critic_credit_trainer(trainer_cfg: TrainerConfig, algo: AlgorithmConfig, dp: DataParallel | None = None):
    """AsyPPO's two mini-critics and attention-rhythm credit, on every rank."""
    torch.manual_seed(0)
    model = tiny_model(**MODEL).train()
    critics = CriticEnsemble(algo.critic, model, "", 0, 2)
    credit = AttentionCredit(model, algo.credit, algo.rhythm, pad_id=0)
    return PolicyTrainer(model, trainer_cfg, algo, 1.0, 0, critics=critics, credit=credit, dp=dp)


@pytest.mark.slow
def test_critics_and_rhythm_credit_are_sharded_like_one_rank():
    """... with FSDP's CPU offload on (host memory unpinned here: there is no GPU)."""
    cfg = TrainerConfig(lr=1e-2, micro_batch_size=2, micro_batch_tokens=None, strategy="fsdp", cpu_offload=True)
    algo = AlgorithmConfig(name="asyppo", credit="local", critic={"warmup_steps": 0})
    single = build_critic_credit_trainer(cfg, algo)
    start = copy.deepcopy(single.policy.state_dict())
    metrics_1 = steps(single, 0, 3)
    group = TrainerGroup(functools.partial(build_critic_credit_trainer, cfg, algo), cfg,
                         RuntimeConfig(trainer_workers=2))
    try:
        metrics_2 = steps(group, 0, 3)
        weights_2 = group.weights()
        critics_2 = group.state_dict()["critics"]["critics"]  # rank 0's, as the checkpoint has them
    finally:
        group.close()
    assert_same_metrics(metrics_1, metrics_2)
    for key in ("critic/value_loss_0", "critic/value_loss_1", "rhythm/gamma_mean", "asyppo/adv_masked_fraction"):
        assert [m[key] for m in metrics_2] == pytest.approx([m[key] for m in metrics_1], rel=1e-5), key
    assert_same_weights(single.policy.state_dict(), weights_2, start)
    for mine, theirs in zip(single.critics.critics, critics_2, strict=True):
        assert_same_weights(mine.state_dict(), theirs)


@pytest.mark.slow
def test_ray_ranks_in_a_placement_group_match_one_rank():
    """runtime.kind=ray: the ranks are Ray actors in one placement group, same numbers; a
    request the cluster cannot hold fails at once with the fields to change."""
    import ray

    cfg = TrainerConfig(lr=1e-2, micro_batch_size=2, micro_batch_tokens=None, strategy="ddp")
    algo = AlgorithmConfig()
    single = build_trainer(cfg, algo)
    metrics_1 = steps(single, 0, 2)
    # Our own Ray, not a cluster some other run started; its workers import this test module.
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR",
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}})
    try:
        with pytest.raises(RuntimeError, match="lower runtime.trainer_workers or runtime.trainer_cpus"):
            TrainerGroup(build_trainer, cfg, RuntimeConfig(kind="ray", trainer_workers=2, trainer_cpus=4))
        group = TrainerGroup(functools.partial(build_trainer, cfg, algo), cfg,
                             RuntimeConfig(kind="ray", trainer_workers=2, trainer_cpus=1))
        try:
            metrics_2 = steps(group, 0, 2)
            weights_2 = group.weights()
        finally:
            group.close()
    finally:
        ray.shutdown()
    assert_same_metrics(metrics_1, metrics_2)
    assert_same_weights(single.policy.state_dict(), weights_2)


def test_config_refuses_data_parallel_settings_that_cannot_work(tiny_llama_dir, monkeypatch):
    cores = len(os.sched_getaffinity(0))
    with pytest.raises(ConfigError, match=rf"runtime.trainer_workers={cores + 1} exceeds the {cores} CPUs.*set "):
        load_config(None, [f"runtime.trainer_workers={cores + 1}"])
    with pytest.raises(ConfigError, match="is more than the 1 sequences of a mini-batch"):
        load_config(None, ["runtime.trainer_workers=2", "rollout.prompts_per_step=1", "rollout.group_size=2",
                           "trainer.mini_batches=2", "trainer.micro_batch_size=1"])
    with pytest.raises(ConfigError, match="set them to false"):
        load_config(None, ["runtime.trainer_workers=2", "runtime.kind=ray", "runtime.critic_actor=true",
                           "algorithm.name=ppo"])
    fsdp = ["runtime.trainer_workers=2", "trainer.strategy=fsdp", f"model.path={tiny_llama_dir}"]
    assert load_config(None, fsdp).trainer.strategy == "fsdp"  # Llama names its decoder layers
    monkeypatch.setattr(LlamaPreTrainedModel, "_no_split_modules", None)  # a model that names no blocks
    with pytest.raises(ConfigError) as err:
        load_config(None, fsdp)
    assert err.value.args[0].splitlines()[1].strip() == (
        "trainer.strategy=fsdp: no decoder layers found in LlamaForCausalLM (its _no_split_modules names none); "
        "use trainer.strategy=ddp"
    )
