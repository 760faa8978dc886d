"""actor_attn: captured maps of selected layers, weight sync, credit on a tiny Llama."""

from __future__ import annotations

import pytest
import torch

from cadence.algo.rhythm import RhythmConfig
from cadence.algo.rhythm_shaping import shape_advantages
from cadence.models.attention import ActorAttention, _decoder_layers
from cadence.models.tiny import tiny_model
from cadence.rollout.sample import Sample
from cadence.train.batch import collate
from cadence.train.credit import AttentionCredit


@pytest.fixture(scope="module")
def policy6():
    """A 6-layer tiny Llama (SDPA, like a trainer's policy)."""
    return tiny_model(layers=6, hidden_size=64, seed=1)


@pytest.fixture(scope="module")
def actor6(policy6) -> ActorAttention:
    return ActorAttention(policy6)


def ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(4, 250, (n,), generator=torch.Generator().manual_seed(seed))


def test_copy_is_eager_and_policy_untouched(policy6, actor6) -> None:
    assert actor6.model is not policy6
    assert actor6.model.config._attn_implementation == "eager"
    assert policy6.config._attn_implementation == "sdpa"
    assert actor6.layer_ids == [2, 3, 4]  # L = 6: the range [2, 4] holds only 3 layers
    assert not any(p.requires_grad for p in actor6.model.parameters())


def test_maps_equal_output_attentions_of_same_layers(actor6) -> None:
    x = ids(33)
    maps = actor6.maps(x)
    assert maps.shape == (3, 4, 33, 33) and maps.dtype == torch.float32
    assert not maps.requires_grad
    with torch.no_grad():
        full = actor6.model(x[None], output_attentions=True).attentions
    assert len(full) == 6  # what the hooks avoid keeping
    for slot, layer in enumerate(actor6.layer_ids):
        assert torch.allclose(maps[slot], full[layer][0], atol=1e-6)
    assert torch.allclose(maps.sum(-1), torch.ones(3, 4, 33), atol=1e-5)
    upper = torch.ones(33, 33, dtype=torch.bool).triu(1)
    assert (maps[..., upper] == 0).all()  # causal


def test_response_rows_and_right_padded_batch(actor6) -> None:
    a, b = ids(20, seed=1), ids(31, seed=2)
    whole_a, whole_b = actor6.maps(a), actor6.maps(b)
    assert torch.equal(actor6.maps(b, query_start=12), whole_b[:, :, 12:])
    batch = torch.zeros(2, 31, dtype=torch.long)
    batch[0, :20], batch[1] = a, b
    maps = actor6.maps(batch)
    assert maps.shape == (2, 3, 4, 31, 31)
    # Right padding needs no mask: causal rows never see the pads after them.
    assert torch.allclose(maps[0, :, :, :20, :20], whole_a, atol=1e-6)
    assert torch.allclose(maps[1], whole_b, atol=1e-6)


def test_stops_after_last_selected_layer(actor6) -> None:
    """Layers above the last selected one (and the LM head) never run."""
    calls = []
    decoder = _decoder_layers(actor6.model)
    handles = [decoder[i].register_forward_hook(lambda *_, i=i: calls.append(i)) for i in range(6)]
    handles.append(actor6.model.lm_head.register_forward_hook(lambda *_: calls.append("head")))
    try:
        actor6.maps(ids(10))
    finally:
        for h in handles:
            h.remove()
    assert calls == [0, 1, 2, 3]  # layer 4's attention ran, then the forward stopped
    # A plain forward afterwards is unaffected by the idle hooks.
    with torch.no_grad():
        assert actor6.model(ids(10)[None]).logits.shape == (1, 10, 260)


def test_five_layers_of_a_deep_model() -> None:
    actor = ActorAttention(tiny_model(layers=15, hidden_size=32, heads=2), layers=5)
    assert actor.layer_ids == [5, 6, 8, 9, 10]
    assert actor.maps(ids(12)).shape == (5, 2, 12, 12)


def test_loads_from_path(tiny_llama_dir) -> None:
    actor = ActorAttention(tiny_llama_dir)
    assert actor.model.config._attn_implementation == "eager"
    assert actor.layer_ids == [0, 1]  # L = 2: both layers
    maps = actor.maps(ids(9), attention_mask=torch.ones(9, dtype=torch.long))
    assert maps.shape == (2, 4, 9, 9)
    assert torch.allclose(maps.sum(-1), torch.ones(2, 4, 9), atol=1e-5)


def test_update_weights_changes_maps(policy6) -> None:
    actor = ActorAttention(policy6)
    x = ids(16)
    before = actor.maps(x)
    other = tiny_model(layers=6, hidden_size=64, seed=7)
    actor.update_weights(other.state_dict(), version=3)
    assert actor.version == 3
    after = actor.maps(x)
    assert not torch.allclose(before, after)
    assert torch.allclose(after, ActorAttention(other).maps(x), atol=1e-6)
    actor.update_weights(policy6.state_dict(), version=4)
    assert torch.allclose(actor.maps(x), before, atol=1e-6)


@pytest.mark.parametrize("mode", ["none", "local", "global", "coupled"])
def test_token_credit(actor6, mode: str) -> None:
    cfg = RhythmConfig(fai_min=2, fai_max=12)
    prompt, response = ids(8, seed=3), ids(30, seed=4)
    gamma, info = actor6.token_credit(prompt, response, mode, cfg)
    assert gamma.shape == info["waad"].shape == info["fai"].shape == (30,)
    assert torch.isfinite(gamma).all() and (gamma >= 1).all()
    assert info["layers"] == [2, 3, 4] and info["spans"].shape == (3, 4)
    assert len(info["local_heads"]) == len(info["global_heads"]) == 3  # floor(0.3 * 12)
    if mode == "none":
        assert (gamma == 1).all()
    elif mode == "local":
        assert info["local"].sum() <= 12 and (gamma > 1).sum() == info["local"].sum()
    else:
        assert 0 < info["anchors"].sum() <= 12  # ceil(0.4 * 30)
    # R = 1 and a response shorter than the windows stay finite.
    for r in [1, 3]:
        g, _ = actor6.token_credit(prompt, response[:r], mode, RhythmConfig())
        assert g.shape == (r,) and torch.isfinite(g).all()


def test_token_credit_batch_matches_single(actor6) -> None:
    """Padded micro-batches give what each sample gets alone (a batch of one)."""
    cfg = RhythmConfig(fai_min=2, fai_max=12)
    prompts = [ids(5, seed=10), ids(9, seed=11), ids(3, seed=12)]
    responses = [ids(20, seed=13), ids(7, seed=14), ids(26, seed=15)]
    batch = actor6.token_credit_batch(prompts, responses, "coupled", cfg, micro_batch=2)
    assert set(batch[0][1]) == {
        "waad",
        "fai",
        "delta",
        "spans",
        "local_heads",
        "global_heads",
        "local",
        "anchors",
        "dominated",
        "introducer",
        "layers",
        "version",
    }
    for (g, info), p, r in zip(batch, prompts, responses, strict=True):
        g1, info1 = actor6.token_credit(p, r, "coupled", cfg)
        assert torch.allclose(info["waad"], info1["waad"], atol=1e-5)
        assert torch.allclose(info["fai"], info1["fai"], atol=1e-5)
        assert torch.equal(g, g1)


def mixed_samples() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Prompts of 3-9 tokens, responses of 1-24 tokens, and two exact duplicates (as GRPO makes)."""
    plen = [5, 9, 3, 5, 7, 3, 5, 9, 4, 6]
    rlen = [20, 7, 24, 1, 14, 3, 2, 18, 11, 4]
    prompts = [ids(p, seed=20 + i) for i, p in enumerate(plen)]
    responses = [ids(r, seed=40 + i) for i, r in enumerate(rlen)]
    prompts += [prompts[0], prompts[6]]
    responses += [responses[0], responses[6]]
    return prompts, responses


@pytest.mark.parametrize("both_signs", [True, False])
@pytest.mark.parametrize(
    ("credit", "overrides"),
    [
        ("local", {}),
        ("global", {"fai_min": 2, "fai_max": 12}),
        ("coupled", {"fai_min": 2, "fai_max": 12}),
        ("coupled", {"fai_min": 3, "lookback": 2, "alpha": 1.0}),
    ],
)
def test_attention_credit_batched_equals_per_sample(
    actor6, policy6, credit, overrides, both_signs
) -> None:
    """The trainer's path (AttentionCredit on a TrainBatch) gives token_credit's gammas per sample."""
    cfg = RhythmConfig(both_signs=both_signs, micro_batch=4, **overrides)
    prompts, responses = mixed_samples()
    samples = [
        Sample("p", i, p.tolist(), r.tolist(), [0.0] * r.numel(), 1.0, 0, "stop")
        for i, (p, r) in enumerate(zip(prompts, responses, strict=True))
    ]
    batch = collate(samples, pad_id=0)
    attention_credit = AttentionCredit(policy6, credit, cfg, pad_id=0)
    assert attention_credit.micro_batch == 4  # from the config
    gammas, metrics = attention_credit.gammas(batch)
    refs = [
        actor6.token_credit(p, r, credit, cfg)[0] for p, r in zip(prompts, responses, strict=True)
    ]
    assert gammas.shape == batch.mask.shape  # aligned with the batch's token tensors
    assert torch.equal(gammas[batch.mask == 0], torch.ones_like(gammas[batch.mask == 0]))
    for row, ref in enumerate(refs):
        assert torch.allclose(gammas[row][batch.mask[row].bool()], ref, atol=1e-6, rtol=0)
    assert metrics["rhythm/attention_seconds"] > 0
    assert metrics["rhythm/amplified_frac"] > 0  # the comparison is not all ones
    adv = torch.randn(batch.mask.shape, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(
        shape_advantages(adv, gammas, batch.mask, both_signs),
        shape_advantages(adv, refs, batch.mask, both_signs),
        atol=1e-6,
        rtol=0,
    )


def test_token_credit_padded_info_and_duplicates(actor6) -> None:
    """with_info gives token_credit's info per row; duplicates are read once and agree."""
    cfg = RhythmConfig(fai_min=2, fai_max=12)
    prompts, responses = mixed_samples()
    lengths = torch.tensor([p.numel() + r.numel() for p, r in zip(prompts, responses, strict=True)])
    starts = torch.tensor([p.numel() for p in prompts])
    padded = torch.full((len(prompts), int(lengths.max()) + 2), 7)  # junk after each row
    for row, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        padded[row, : p.numel() + r.numel()] = torch.cat([p, r])

    forwards = []
    original = actor6.maps
    actor6.maps = lambda x, **kw: forwards.append(x.shape[0]) or original(x, **kw)
    try:
        gammas, infos = actor6.token_credit_padded(
            padded, starts, lengths, "coupled", cfg, micro_batch=3, with_info=True
        )
        plain, none = actor6.token_credit_padded(
            padded, starts, lengths, "coupled", cfg, micro_batch=3
        )
    finally:
        del actor6.maps
    assert forwards[: len(forwards) // 2] == [3, 3, 3, 1]  # 10 distinct rows of 12
    assert none == [] and all(torch.equal(a, b) for a, b in zip(gammas, plain, strict=True))
    assert torch.equal(gammas[10], gammas[0]) and torch.equal(gammas[11], gammas[6])
    for row, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        gamma, ref = actor6.token_credit(p, r, "coupled", cfg)
        info = infos[row]
        assert torch.allclose(gammas[row], gamma, atol=1e-6, rtol=0)
        assert set(info) == set(ref)
        for key in ("waad", "fai", "delta", "spans"):
            assert torch.allclose(info[key], ref[key], atol=1e-5, rtol=1e-5), key
        for key in ("local_heads", "global_heads", "local", "anchors", "dominated", "introducer"):
            assert torch.equal(info[key], ref[key]), key
        assert info["layers"] == ref["layers"] and info["version"] == ref["version"]
    with pytest.raises(ValueError, match="response_start"):
        actor6.token_credit_padded(padded, lengths + 1, lengths, "coupled", cfg)


@pytest.mark.parametrize("credit", ["local", "global", "coupled"])
def test_episode_observations_are_read_but_not_credited(actor6, policy6, credit: str) -> None:
    """An agentic episode: model turn, observation, model turn. The trainer's path ranks only
    the model's tokens (loss mask 1), as token_credit does with the same loss_mask."""
    cfg = RhythmConfig(fai_min=2, fai_max=12, micro_batch=3)
    prompts, responses = mixed_samples()
    masks = []
    for r in responses:  # the middle third of each response is an observation
        n = r.numel()
        masks.append([0 if n // 3 <= i < 2 * n // 3 else 1 for i in range(n)])
    samples = [
        Sample("p", i, p.tolist(), r.tolist(), [0.0] * r.numel(), 1.0, 0, "stop", loss_mask=m)
        for i, (p, r, m) in enumerate(zip(prompts, responses, masks, strict=True))
    ]
    # Same tokens as row 0, every token trained: identical ids must not share a result.
    samples.append(Sample("p", 99, prompts[0].tolist(), responses[0].tolist(), [0.0] * 20, 1.0, 0, "stop"))
    batch = collate(samples, pad_id=0)
    gammas, _ = AttentionCredit(policy6, credit, cfg, pad_id=0).gammas(batch)
    assert torch.equal(gammas[batch.mask == 0], torch.ones_like(gammas[batch.mask == 0]))
    for row, (p, r, m) in enumerate(zip(prompts, responses, masks, strict=True)):
        trained = torch.tensor(m)
        ref, info = actor6.token_credit(p, r, credit, cfg, loss_mask=trained)
        assert (ref[trained == 0] == 1).all()  # no credit lands on the observation
        picked = info["local"] if credit == "local" else info["anchors"]
        assert not picked[trained == 0].any()
        assert picked.sum() <= -(-2 * int(trained.sum()) // 5)  # ceil(0.4 * trained tokens)
        span = batch.response_start[row]
        assert torch.allclose(gammas[row, span : span + r.numel()], ref, atol=1e-6, rtol=0)
    whole, _ = actor6.token_credit(prompts[0], responses[0], credit, cfg)
    span = batch.response_start[-1]
    assert torch.allclose(gammas[-1, span : span + 20], whole, atol=1e-6, rtol=0)
    # Observations inside the response change which model tokens win: the mask matters.
    assert any(
        not torch.equal(actor6.token_credit(p, r, credit, cfg, loss_mask=torch.tensor(m))[0],
                        actor6.token_credit(p, r, credit, cfg)[0])
        for p, r, m in zip(prompts, responses, masks, strict=True)
    )
    with pytest.raises(ValueError, match="loss_mask"):
        actor6.token_credit(prompts[0], responses[0], credit, cfg, loss_mask=torch.ones(3))
