"""PolicyTrainer on a tiny model: the update goes the right way, micro-batching is exact."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch

from cadence.algo.config import AlgorithmConfig
from cadence.config import TrainerConfig
from cadence.models.tiny import tiny_model
from cadence.rollout.sample import Group, Sample
from cadence.train.batch import collate, flatten, micro_batches
from cadence.train.logprobs import batched_logprobs, forward_logits, token_logprobs
from cadence.train.trainer import PolicyTrainer


def make_groups(version: int = 0) -> list[Group]:
    """Two prompts, two responses each; in each group one response earns reward 1."""
    groups = []
    for gid, prompt in enumerate([[10, 11, 12], [13, 14]]):
        g = Group(group_id=gid, prompt_id=str(gid))
        for j, (resp, reward) in enumerate([([20, 21, 22], 1.0), ([30, 31], 0.0)]):
            g.samples.append(Sample(str(gid), gid, prompt, resp, [-1.0] * len(resp), reward, version, "stop", f"r{j}"))
        groups.append(g)
    return groups


def trainer_for(model, **overrides) -> PolicyTrainer:
    cfg = TrainerConfig(**{"lr": 1e-2, "micro_batch_size": 4, **overrides})
    return PolicyTrainer(model, cfg, AlgorithmConfig(), temperature=1.0, pad_id=0)


def response_token_logprobs(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return token_logprobs(forward_logits(model, batch.input_ids, batch.attention_mask), batch.input_ids, 1.0)


def response_logprob(model, groups) -> torch.Tensor:
    batch = collate(flatten(groups), pad_id=0)
    lp = batched_logprobs(model.eval(), batch.input_ids, batch.attention_mask, 1.0, micro=8)
    model.train()
    return (lp * batch.mask).sum(-1)


def test_grpo_step_moves_probability_towards_rewarded_responses():
    model = tiny_model(hidden_size=32, layers=1, heads=2)
    groups = make_groups()
    before = response_logprob(model, groups)
    trainer = trainer_for(model)
    for _ in range(3):
        metrics = trainer.step(groups)
    after = response_logprob(model, groups)
    rewarded = torch.tensor([True, False, True, False])
    assert (after - before)[rewarded].min() > 0
    assert (after - before)[~rewarded].max() < 0
    assert trainer.version == 3
    assert metrics["train/grad_norm"] > 0


def test_micro_batches_follow_length_and_token_budget():
    lengths = torch.tensor([3, 40, 5, 9, 41, 2, 7])
    parts = micro_batches(lengths, max_rows=3, max_tokens=60)
    assert sorted(torch.cat(parts).tolist()) == list(range(7))  # every row exactly once
    assert [p.tolist() for p in parts] == [[4], [1], [3, 6, 2], [0, 5]]  # longest first, similar together
    assert all(len(p) * int(lengths[p].max()) <= 60 or len(p) == 1 for p in parts)
    assert [len(p) for p in micro_batches(lengths, max_rows=3)] == [3, 3, 1]  # no budget: rows only


def test_micro_batches_accumulate_to_the_full_batch_gradient():
    base = tiny_model(hidden_size=32, layers=1, heads=2)
    grads = []
    for micro, tokens in ((4, None), (1, None), (4, 7)):
        model = copy.deepcopy(base)
        trainer = trainer_for(model, micro_batch_size=micro, micro_batch_tokens=tokens, lr=1e-9)
        trainer.optimizer.step = lambda: None  # keep weights; inspect the accumulated gradient
        trainer.step(make_groups())
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    for g in grads[1:]:
        assert torch.allclose(grads[0], g, atol=1e-6, rtol=1e-4)


def behaviour_from(model, groups: list[Group]) -> list[Group]:
    """Give every sample the log-probs `model` assigns its tokens, as the engine would (mu)."""
    batch = collate(flatten(groups), pad_id=0)
    lp = response_token_logprobs(model.eval(), batch)
    model.train()
    for row, s in enumerate(flatten(groups)):
        s.behaviour_logprobs = lp[row][batch.mask[row].bool()].tolist()
    return groups


@pytest.mark.parametrize("loss", ["tis", "decoupled_ppo"])
def test_stale_samples_are_weighted_against_the_engines_behaviour_policy(loss):
    """mu is the engine's log-probs at the version that sampled; after an update the trainer's
    policy differs from it, and the loss's importance weight is exactly pi_old / mu."""
    model = tiny_model(hidden_size=32, layers=1, heads=2)
    stale = behaviour_from(model, make_groups(version=0))  # mu: the version-0 weights
    trainer = PolicyTrainer(model, TrainerConfig(lr=1e-2, micro_batch_size=4),
                            AlgorithmConfig(loss=loss), temperature=1.0, pad_id=0)
    trainer.step(behaviour_from(model, make_groups(version=0)))  # version 0 -> 1, weights move
    batch = collate(flatten(stale), pad_id=0)
    pi_old = response_token_logprobs(model, batch)
    valid = batch.mask.bool()
    w = torch.exp(pi_old - batch.behaviour_logprobs)[valid]
    assert (w - 1).abs().max() > 1e-3  # the update really made these samples off-policy
    metric = "is_weight_mean" if loss == "tis" else "behaviour_weight_mean"
    expected = w.clamp(max=2.0).mean() if loss == "tis" else w.mean()
    metrics = trainer.step(stale)
    assert metrics["train/staleness_max"] == 1
    assert metrics[f"train/{metric}"] == pytest.approx(float(expected), rel=1e-4)


def test_fresh_samples_have_behaviour_weight_one():
    """Synchronous data (mu from the current weights): every off-policy weight is 1."""
    model = tiny_model(hidden_size=32, layers=1, heads=2)
    trainer = PolicyTrainer(model, TrainerConfig(lr=1e-2, micro_batch_size=4),
                            AlgorithmConfig(loss="tis"), temperature=1.0, pad_id=0)
    metrics = trainer.step(behaviour_from(model, make_groups(version=0)))
    assert metrics["train/is_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["train/staleness_max"] == 0


def test_old_logprobs_pass_only_for_repeated_updates():
    """One update per batch: pi_old is pi_theta at that update, the extra pass would repeat it."""
    model = tiny_model(hidden_size=32, layers=1, heads=2)
    stale = collate(flatten(make_groups(version=0)), pad_id=0)
    trainer = trainer_for(model)
    trainer.version = 3
    assert not trainer._needs_old_logprobs(stale)
    assert trainer_for(model, epochs=2)._needs_old_logprobs(stale)
    assert trainer_for(model, mini_batches=2, micro_batch_size=2)._needs_old_logprobs(stale)
    # ... and the recomputed pi_old equals the update's own detached log-probs.
    old = trainer_for(model, recompute_old_logprobs="always")._old_logprobs(stale)
    model.train()
    lp = response_token_logprobs(model, stale)
    assert torch.allclose(old * stale.mask, lp * stale.mask, atol=1e-6)


def test_staleness_counts_versions_behind_the_trainer():
    """Samples started at version 1 and trained at version 3 are 2 versions stale."""
    model = tiny_model(hidden_size=32, layers=1, heads=2)
    trainer = trainer_for(model)
    trainer.version = 3
    groups = make_groups(version=1)
    groups[0].samples[0].version = 0  # one sample is older still
    metrics = trainer.step(groups)
    assert metrics["train/staleness_max"] == 3
    assert metrics["train/staleness_mean"] == pytest.approx((3 + 2 + 2 + 2) / 4)
    assert trainer.version == 4


# -- gradient norm by staleness bucket --------------------------------------------------------


class Bigram(torch.nn.Module):
    """A linear model on the one-hot current token: next-token logits = its row of `table`."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.zeros(vocab, vocab))

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        return SimpleNamespace(logits=self.table[input_ids])


# (prompt, response, reward, version, staleness bucket at trainer version 9), two samples a group.
BIGRAM_SAMPLES = [([1, 2], [3, 4], 1.0, 9, "0"), ([1, 2], [5], 0.0, 9, "0"),
                  ([2, 3], [4, 6, 1], 1.0, 8, "1"), ([2, 3], [6], 0.0, 5, "4-7"),
                  ([6], [2, 2], 0.0, 0, "8+"), ([6], [1], 1.0, 7, "2-3")]


def bigram_groups(vocab: int) -> list[Group]:
    """BIGRAM_SAMPLES whose behaviour log-probs are the all-zero table's (uniform: -log V)."""
    groups = [Group(group_id=g, prompt_id=str(g)) for g in range(3)]
    for i, (prompt, response, reward, version, _) in enumerate(BIGRAM_SAMPLES):
        mu = [-math.log(vocab)] * len(response)
        groups[i // 2].samples.append(Sample(str(i // 2), i // 2, prompt, response, mu, reward, version, "stop", f"r{i}"))
    return groups


def test_grad_norm_per_staleness_bucket_is_the_norm_of_that_buckets_gradient():
    """By hand: the table is zero, so pi_theta = mu = uniform, every ratio is 1, and GRPO's token-mean
    loss -(1/N) sum_t A_t r_t has gradient -(A_t / N)(onehot(y_t) - 1/V) on the row of y_t's context
    token. A bucket's gradient sums its own tokens' terms (N = all 10 response tokens)."""
    vocab = 8
    algo = AlgorithmConfig(std_normalize=False)  # A = reward - group mean = +-0.5
    trainer = PolicyTrainer(Bigram(vocab), TrainerConfig(micro_batch_size=2, grad_norm_by_staleness="on"), algo,
                            temperature=1.0, pad_id=0)
    trainer.version = 9
    metrics = trainer.step(bigram_groups(vocab))

    n_tokens = sum(len(sample[1]) for sample in BIGRAM_SAMPLES)
    expected = {}
    for i, (prompt, response, reward, _, bucket) in enumerate(BIGRAM_SAMPLES):
        advantage = reward - (reward + BIGRAM_SAMPLES[i ^ 1][2]) / 2  # the other sample of its group
        grad = expected.setdefault(bucket, torch.zeros(vocab, vocab))
        text = prompt + response
        for j, token in enumerate(response):
            context = text[len(prompt) + j - 1]
            grad[context] -= advantage / n_tokens * (torch.nn.functional.one_hot(torch.tensor(token), vocab) - 1 / vocab)
    assert set(expected) == {"0", "1", "2-3", "4-7", "8+"}
    for bucket, grad in expected.items():
        assert metrics[f"offpolicy/grad_norm_stale_{bucket}"] == pytest.approx(float(grad.norm()), rel=1e-5)
    total = sum(expected.values())
    assert metrics["train/grad_norm"] == pytest.approx(float(total.norm()), rel=1e-5)


def mixed_staleness_groups() -> list[Group]:
    """make_groups at trainer version 6 with staleness 0, 1, 3 and 6 (four buckets)."""
    groups = make_groups(version=6)
    for sample, version in zip(flatten(groups), [6, 5, 3, 0], strict=True):
        sample.version = version
    return groups


def accumulated_gradient(model, by_staleness: str, algo: AlgorithmConfig, groups: list[Group], **cfg):
    """The gradient the optimizer steps with (clipped: the same factor either way) and the step's metrics."""
    trainer = PolicyTrainer(model, TrainerConfig(lr=1e-2, grad_norm_by_staleness=by_staleness, **cfg), algo, 1.0, 0)
    trainer.version = 6
    seen = []
    trainer.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: seen.append(torch.cat([p.grad.flatten() for p in model.parameters()])))
    metrics = trainer.step(groups)
    return seen[0], metrics


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_splitting_by_staleness_leaves_the_gradient_unchanged(aggregation):
    """Micro-batches run bucket by bucket (here 1 row each: every bucket its own micro-batch, unlike
    the length-sorted split) still sum to the mini-batch's gradient, in every aggregation mode."""
    base = tiny_model(hidden_size=32, layers=1, heads=2)
    algo = AlgorithmConfig(aggregation=aggregation)
    off, plain = accumulated_gradient(copy.deepcopy(base), "off", algo, mixed_staleness_groups(), micro_batch_size=4)
    on, split = accumulated_gradient(copy.deepcopy(base), "on", algo, mixed_staleness_groups(), micro_batch_size=4)
    assert torch.allclose(off, on, atol=1e-7, rtol=1e-5)
    assert split["train/grad_norm"] == pytest.approx(plain["train/grad_norm"], rel=1e-5)
    assert not any(k.startswith("offpolicy/grad_norm_stale") for k in plain)
    buckets = sorted(k for k in split if k.startswith("offpolicy/grad_norm_stale"))
    assert buckets == [f"offpolicy/grad_norm_stale_{b}" for b in ("0", "1", "2-3", "4-7")]


def test_grad_norm_by_staleness_auto_logs_only_batches_with_stale_samples():
    model = tiny_model(hidden_size=32, layers=1, heads=2)
    trainer = trainer_for(model, grad_norm_by_staleness_every=1)
    fresh = trainer.step(make_groups(version=0))
    assert not any(k.startswith("offpolicy/grad_norm_stale") for k in fresh)
    stale = trainer.step(make_groups(version=0))  # trained at version 1: every sample 1 behind
    assert stale["offpolicy/grad_norm_stale_1"] == pytest.approx(stale["train/grad_norm"], rel=1e-6)
    assert "offpolicy/grad_norm_stale_0" not in stale  # only the buckets present


def test_grad_norm_by_staleness_auto_samples_every_nth_step_and_on_measures_all():
    """Splitting by bucket costs padding on long-tailed batches: auto measures steps 3, 6, ... (every=3)."""
    logged = {}
    for mode in ("auto", "on"):
        trainer = trainer_for(tiny_model(hidden_size=32, layers=1, heads=2), grad_norm_by_staleness=mode,
                              grad_norm_by_staleness_every=3)
        logged[mode] = [step for step in range(1, 8)
                        if "offpolicy/grad_norm_stale_1" in trainer.step(make_groups(version=trainer.version - 1))]
    assert logged == {"auto": [3, 6], "on": [1, 2, 3, 4, 5, 6, 7]}


def test_grad_norm_by_staleness_is_refused_where_it_would_change_the_gradient():
    model = tiny_model(hidden_size=32, layers=1, heads=2)
    with pytest.raises(ValueError, match="grad_norm_by_staleness=on: M2PO"):
        PolicyTrainer(model, TrainerConfig(grad_norm_by_staleness="on"),
                      AlgorithmConfig(mismatch={"mode": "m2po"}), 1.0, 0)
    trainer = PolicyTrainer(model, TrainerConfig(), AlgorithmConfig(mismatch={"mode": "m2po"}), 1.0, 0)
    trainer.version = 6
    assert not any(k.startswith("offpolicy/grad_norm_stale") for k in trainer.step(mixed_staleness_groups()))


def test_a_bucket_missing_from_some_mini_batches_is_averaged_over_those_that_had_it():
    """Two mini-batches, one stale sample: its bucket's norm is that one update's, not halved."""
    model = tiny_model(hidden_size=32, layers=1, heads=2)
    trainer = trainer_for(model, mini_batches=2, micro_batch_size=2, grad_norm_by_staleness="on")
    trainer.version = 3
    groups = make_groups(version=3)
    groups[1].samples[0].version = 0  # 3 behind: bucket 2-3, in one of the two mini-batches
    updates = []
    update = trainer._update
    trainer._update = lambda *args: updates.append(update(*args)) or updates[-1]
    metrics = trainer.step(groups)
    had = [u["offpolicy/grad_norm_stale_2-3"] for u in updates if "offpolicy/grad_norm_stale_2-3" in u]
    assert len(updates) == 2 and len(had) == 1
    assert metrics["offpolicy/grad_norm_stale_2-3"] == pytest.approx(had[0])
    assert metrics["offpolicy/grad_norm_stale_0"] == pytest.approx(
        sum(u["offpolicy/grad_norm_stale_0"] for u in updates) / 2)


def test_grad_norm_by_staleness_reads_on_and_off_as_yaml_writes_them():
    """`trainer.grad_norm_by_staleness=on` on the command line arrives as YAML's true."""
    assert TrainerConfig(grad_norm_by_staleness=True).grad_norm_by_staleness == "on"
    assert TrainerConfig(grad_norm_by_staleness=False).grad_norm_by_staleness == "off"
    with pytest.raises(ValueError, match="grad_norm_by_staleness"):
        TrainerConfig(grad_norm_by_staleness="sometimes")
