"""Attention-rhythm math: metrics against direct loops, head classes, credit rules."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from cadence.algo.rhythm import (
    RhythmConfig,
    class_maps,
    classify_heads,
    credit_metrics,
    credit_selection,
    credit_weights,
    fai,
    head_spans,
    local_delta,
    select_layers,
    shape_advantages,
    top_q_mask,
    waad,
)
from cadence.algo.rhythm_batched import credit_selection_batch, rhythm_credit_batch


def causal_maps(*shape: int, seed: int = 0) -> torch.Tensor:
    """Random row-stochastic causal attention maps [..., N, N] (float64 for exact loops)."""
    g = torch.Generator().manual_seed(seed)
    n = shape[-1]
    logits = torch.randn(*shape, n, generator=g, dtype=torch.float64) * 2
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    return logits.masked_fill(future, -math.inf).softmax(-1)


# ----------------------------------------------------------------------------
# Direct double-loop references, written straight from the SPEC equations.


def loop_waad(a: torch.Tensor, p: int, w: int) -> list[float]:
    n = a.shape[-1]
    return [sum(float(a[t, s]) * min(t - s, w) for s in range(t + 1)) for t in range(p, n)]


def loop_fai(a: torch.Tensor, p: int, h_min: int, h_max: int) -> list[float]:
    n = a.shape[-1]
    out = []
    for s in range(p, n):
        ts = [t for t in range(p, n) if s + h_min <= t <= min(n - 1, s + h_max)]
        out.append(sum(float(a[t, s]) for t in ts) / len(ts) if ts else 0.0)
    return out


def loop_span(a: torch.Tensor, p: int) -> float:
    n = a.shape[-1]
    total = sum(float(a[t, s]) * (t - s) for t in range(p, n) for s in range(t + 1))
    return total / (n - p)


# ----------------------------------------------------------------------------
# Metrics vs loops


@pytest.mark.parametrize("seed", range(4))
def test_waad_fai_span_match_loops(seed: int) -> None:
    n, p = 40, 7
    a = causal_maps(n, seed=seed)
    assert torch.allclose(waad(a, p, 10), torch.tensor(loop_waad(a, p, 10), dtype=torch.float32))
    assert torch.allclose(
        fai(a, p, 10, 100), torch.tensor(loop_fai(a, p, 10, 100), dtype=torch.float32)
    )
    assert torch.allclose(fai(a, p, 3, 8), torch.tensor(loop_fai(a, p, 3, 8), dtype=torch.float32))
    heads = causal_maps(2, 3, n, seed=seed + 100)
    spans = head_spans(heads, p)
    assert spans.shape == (2, 3)
    expected = torch.tensor([[loop_span(heads[lay, h], p) for h in range(3)] for lay in range(2)])
    assert torch.allclose(spans, expected.float(), atol=1e-5)
    assert torch.allclose(head_spans(heads[0], p), spans[0])


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 30),
    data=st.data(),
    w=st.integers(1, 12),
    h_min=st.integers(1, 12),
    h_len=st.integers(0, 20),
    seed=st.integers(0, 10_000),
)
def test_metrics_match_loops_property(n, data, w, h_min, h_len, seed) -> None:
    p = data.draw(st.integers(0, n - 1))
    a = causal_maps(n, seed=seed)
    got_w, got_f = waad(a, p, w), fai(a, p, h_min, h_min + h_len)
    assert got_w.shape == got_f.shape == (n - p,)
    assert torch.isfinite(got_w).all() and torch.isfinite(got_f).all()
    assert torch.allclose(got_w, torch.tensor(loop_waad(a, p, w), dtype=torch.float32), atol=1e-6)
    assert torch.allclose(
        got_f, torch.tensor(loop_fai(a, p, h_min, h_min + h_len), dtype=torch.float32), atol=1e-6
    )
    assert math.isclose(
        float(head_spans(a[None], p)[0]), loop_span(a, p), rel_tol=1e-5, abs_tol=1e-6
    )


def test_response_rows_give_same_metrics() -> None:
    """Maps of response rows only ([N-p, N], what ActorAttention returns) read like whole maps."""
    n, p = 25, 9
    a = causal_maps(n, seed=3)
    assert torch.equal(waad(a, p), waad(a[p:], p))
    assert torch.equal(fai(a, p, 2, 9), fai(a[p:], p, 2, 9))
    assert torch.equal(head_spans(a[None], p), head_spans(a[None, p:], p))
    with pytest.raises(ValueError):
        waad(a[p + 1 :], p)


def test_short_responses_have_no_nan() -> None:
    """R = 1 and R below every window: all metrics finite, FAI 0 where no future is in range."""
    for n, p in [(5, 4), (12, 4), (1, 0)]:
        a = causal_maps(n, seed=n)
        w, f = waad(a, p, 10), fai(a, p, 10, 100)
        assert torch.isfinite(w).all() and torch.isfinite(f).all()
        assert (f == 0).all()  # R <= 10: no t with t - s >= 10
        for mode in ["none", "local", "global", "coupled"]:
            g = credit_weights(w, f, RhythmConfig(credit=mode))
            assert g.shape == (n - p,) and torch.isfinite(g).all() and (g >= 1).all()
    # R = 1: Delta is 0 (no successor), so local never fires; FAI from real maps is 0 too.
    one = torch.tensor([0.7])
    assert credit_weights(one, torch.zeros(1), RhythmConfig(credit="local")).tolist() == [1.0]
    assert credit_weights(one, torch.zeros(1), RhythmConfig(credit="coupled")).tolist() == [1.0]


def test_waad_is_capped_and_first_token_zero() -> None:
    n = 30
    a = torch.zeros(n, n)
    a[:, 0] = 1.0  # every token attends to position 0 only
    w = waad(a, 0, window=10)
    assert w.tolist() == [float(min(t, 10)) for t in range(n)]


# ----------------------------------------------------------------------------
# Layers and heads


def test_select_layers() -> None:
    assert select_layers(36) == [12, 15, 18, 21, 24]
    assert select_layers(28) == [9, 11, 14, 16, 18]  # 11.25, 13.5 -> 14 (half up), 15.75
    assert select_layers(15) == [5, 6, 8, 9, 10]  # 5, 6.25, 7.5 -> 8, 8.75, 10
    assert select_layers(6) == [2, 3, 4]  # range holds 3 layers: all of them
    assert select_layers(4) == [1, 2]
    assert select_layers(2) == [0, 1]
    assert select_layers(1) == [0]
    assert select_layers(36, k=1) == [18]
    for layers in range(1, 80):
        picks = select_layers(layers)
        assert 1 <= len(picks) <= 5 and picks == sorted(set(picks))
        assert layers // 3 <= picks[0] and picks[-1] <= (2 * layers) // 3 < layers
    with pytest.raises(ValueError):
        select_layers(0)


def test_classify_heads_fractions() -> None:
    spans = torch.tensor([[5.0, 1.0, 9.0, 3.0, 7.0], [2.0, 8.0, 4.0, 6.0, 0.0]])
    local, glob = classify_heads(spans, 0.3)  # floor(0.3 * 10) = 3 each
    assert local.tolist() == [9, 1, 5]  # spans 0, 1, 2
    assert glob.tolist() == [2, 6, 4]  # spans 9, 8, 7
    assert set(local.tolist()).isdisjoint(glob.tolist())
    local, glob = classify_heads(spans, 0.5)
    assert len(local) == len(glob) == 5 and set(local.tolist()).isdisjoint(glob.tolist())
    local, glob = classify_heads(torch.arange(4.0), 0.3)  # floor(1.2) = 1
    assert local.tolist() == [0] and glob.tolist() == [3]
    local, glob = classify_heads(torch.tensor([2.0]), 0.3)  # one head is both classes
    assert local.tolist() == glob.tolist() == [0]
    local, _ = classify_heads(torch.ones(6), 0.3)  # ties keep the earlier head
    assert local.tolist() == [0]


def test_class_maps_average_their_heads() -> None:
    maps = causal_maps(2, 3, 8, seed=1)
    a_loc, a_glob = class_maps(maps, torch.tensor([0, 4]), torch.tensor([5]))
    assert torch.allclose(a_loc, ((maps[0, 0] + maps[1, 1]) / 2).float())
    assert torch.allclose(a_glob, maps[1, 2].float())
    assert torch.allclose(a_loc.sum(-1), torch.ones(8))


# ----------------------------------------------------------------------------
# Credit rules, by hand


def test_top_q_mask_ceil_positive_and_ties() -> None:
    score = torch.tensor([0.1, 0.5, 0.2, 0.5, 0.0])
    assert top_q_mask(score, 0.4).tolist() == [False, True, False, True, False]  # k = 2
    assert top_q_mask(score, 0.2).tolist() == [False, True, False, False, False]  # tie -> earlier
    assert top_q_mask(score, 0.5).tolist() == [False, True, True, True, False]  # ceil(2.5) = 3
    assert top_q_mask(score, 1.0).sum() == 4  # the zero score is never selected
    assert top_q_mask(torch.ones(5), 0.6).sum() == 3  # 0.6 * 5 is 3.0000000000000004 in floats
    assert top_q_mask(torch.ones(3), 0.1).sum() == 1  # ceil: a short response still gets one


def test_local_delta() -> None:
    delta = local_delta(torch.tensor([0.0, 1.0, 1.0, 4.0, 4.0]))
    assert delta.tolist() == [1.0, 0.0, 3.0, 0.0, 0.0]
    assert local_delta(torch.tensor([2.0])).tolist() == [0.0]


def test_credit_none_local_global() -> None:
    w = torch.tensor([0.0, 1.0, 1.0, 4.0, 4.0])  # Delta = [1, 0, 3, 0, 0]
    f = torch.tensor([0.1, 0.5, 0.2, 0.5, 0.0])
    assert credit_weights(w, f, RhythmConfig()).tolist() == [1.0] * 5
    local = RhythmConfig(credit="local")  # k = 2: Delta 3 and 1
    assert credit_weights(w, f, local).tolist() == [1.5, 1.0, 1.5, 1.0, 1.0]
    # q = 0.6 -> k = 3, but the third-best Delta is 0: not a boundary, not selected.
    wider = RhythmConfig(credit="local", top_q=0.6)
    assert credit_weights(w, f, wider).tolist() == [1.5, 1.0, 1.5, 1.0, 1.0]
    glob = RhythmConfig(credit="global", gamma_amp=2.0)
    assert credit_weights(w, f, glob).tolist() == [1.0, 2.0, 1.0, 2.0, 1.0]


def test_credit_coupled_hand_computed() -> None:
    # WAAD  = [0, 4, 4, 1, 1, 5] -> Delta = [4, 0, 3, 0, 4, 0]
    # tau_waad = median WAAD = 2.5; tau_Delta = median of [4, 0, 3, 0, 4] = 3.
    # FAI top ceil(0.4 * 6) = 3: anchors 3 (0.9), 4 (0.8), 1 (0.1).
    #   anchor 1: WAAD 4 > 2.5, not dominated, keeps 1.5.
    #   anchor 3: WAAD 1; Delta_{2,1,0} = 3, 0, 4 -> max 4 >= 3, introducer 0.
    #   anchor 4: WAAD 1; Delta_{3,2,1} = 0, 3, 0 -> max 3 >= 3, introducer 2.
    # Dominated anchors keep 1 + 0.5 * 0.5, introducers gain 0.5 * 0.5.
    w = torch.tensor([0.0, 4.0, 4.0, 1.0, 1.0, 5.0])
    f = torch.tensor([0.0, 0.1, 0.0, 0.9, 0.8, 0.05])
    sel = credit_selection(w, f, RhythmConfig(credit="coupled"))
    assert sel.gamma.tolist() == [1.25, 1.5, 1.25, 1.25, 1.25, 1.0]
    assert sel.anchors.tolist() == [False, True, False, True, True, False]
    assert sel.dominated.tolist() == [False, False, False, True, True, False]
    assert sel.introducer.tolist() == [-1, -1, -1, 0, 2, -1]
    # total amplification is conserved: 3 anchors x 0.5
    assert math.isclose(float((sel.gamma - 1).sum()), 1.5)

    # Numeric thresholds: nothing is dominated with tau_waad below every WAAD -> global rule.
    strict = RhythmConfig(credit="coupled", tau_waad=-1.0)
    assert credit_weights(w, f, strict).tolist() == [1.0, 1.5, 1.0, 1.5, 1.5, 1.0]
    # alpha = 1 hands everything over; tau_delta = 3.5 drops anchor 4 (its window max is 3).
    full = RhythmConfig(credit="coupled", alpha=1.0, tau_delta=3.5)
    assert credit_weights(w, f, full).tolist() == [1.5, 1.5, 1.0, 1.0, 1.5, 1.0]


def test_coupled_introducer_ties_nearest_and_accumulates() -> None:
    # Delta = [2, 2, 0, 0]; anchors 2 and 3 (top FAI, q = 0.5); low WAAD, tau_delta 1.
    w = torch.tensor([1.0, 3.0, 1.0, 1.0])
    f = torch.tensor([0.0, 0.0, 0.9, 0.8])
    cfg = RhythmConfig(credit="coupled", top_q=0.5, tau_waad=1.0, tau_delta=1.0)
    sel = credit_selection(w, f, cfg)
    # anchor 2 looks back at Delta_1 = 2, Delta_0 = 2: tie -> nearest, introducer 1.
    # anchor 3 looks back at Delta_2 = 0, Delta_1 = 2, Delta_0 = 2 -> introducer 1.
    assert sel.introducer.tolist() == [-1, -1, 1, 1]
    assert sel.gamma.tolist() == [1.0, 1.5, 1.25, 1.25]
    # The first response token has no look-back window: an anchor there is never dominated.
    sel = credit_selection(torch.tensor([0.0, 5.0]), torch.tensor([1.0, 0.0]), cfg)
    assert sel.gamma.tolist() == [1.5, 1.0] and not sel.dominated.any()


# ----------------------------------------------------------------------------
# Shaping and metrics


def test_shape_advantages_signs_mask_and_detach() -> None:
    adv = torch.tensor([[1.0, -2.0, 3.0, 0.5], [-1.0, 2.0, -3.0, 4.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]])
    gam = torch.tensor([[1.5, 1.5, 1.0, 1.5], [1.5, 1.5, 1.5, 1.0]], requires_grad=True)
    both = shape_advantages(adv, gam, mask)
    assert both.tolist() == [[1.5, -3.0, 3.0, 0.5], [-1.0, 3.0, -4.5, 4.0]]
    pos = shape_advantages(adv, gam, mask, both_signs=False)
    assert pos.tolist() == [[1.5, -2.0, 3.0, 0.5], [-1.0, 3.0, -3.0, 4.0]]
    pos.sum().backward()
    assert gam.grad is None  # weights are detached

    # Per-sample gamma vectors fill the mask positions in order.
    ragged = [torch.tensor([2.0, 1.0, 1.5]), torch.tensor([1.0, 2.0, 1.0])]
    out = shape_advantages(adv.detach(), ragged, mask)
    assert out.tolist() == [[2.0, -2.0, 4.5, 0.5], [-1.0, 2.0, -6.0, 4.0]]
    with pytest.raises(ValueError):
        shape_advantages(adv.detach(), [torch.ones(2), torch.ones(3)], mask)


def test_credit_metrics() -> None:
    gam = torch.tensor([[1.5, 1.0, 9.0], [1.0, 1.25, 1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    m = credit_metrics(gam, mask)
    assert m["rhythm/amplified_frac"] == pytest.approx(0.4)
    assert m["rhythm/gamma_mean"] == pytest.approx(5.75 / 5)
    m = credit_metrics([torch.tensor([1.5, 1.0]), torch.tensor([1.0])])
    assert m["rhythm/amplified_frac"] == pytest.approx(1 / 3)
    assert credit_metrics([])["rhythm/gamma_mean"] == 1.0


def test_config_validation() -> None:
    cfg = RhythmConfig()
    assert (cfg.credit, cfg.window, cfg.fai_min, cfg.fai_max) == ("none", 10, 10, 100)
    assert (cfg.head_fraction, cfg.gamma_amp, cfg.top_q, cfg.both_signs) == (0.3, 1.5, 0.4, True)
    assert (cfg.alpha, cfg.lookback, cfg.layers, cfg.micro_batch) == (0.5, 3, 5, 128)
    assert cfg.tau_waad == cfg.tau_delta == "median"
    assert RhythmConfig(tau_waad=2.0).tau_waad == 2.0
    for bad in [
        {"typo": 1},
        {"fai_min": 50, "fai_max": 20},
        {"head_fraction": 0.6},
        {"credit": "all"},
        {"tau_delta": "mean"},
        {"micro_batch": 0},
    ]:
        with pytest.raises(ValidationError):
            RhythmConfig(**bad)


# ----------------------------------------------------------------------------
# Batched over samples == per sample


def per_sample(maps: torch.Tensor, p: int, cfg: RhythmConfig) -> dict[str, torch.Tensor]:
    """The readable per-sample chain on one sample's maps [layers, H, rows, N]."""
    spans = head_spans(maps, p)
    loc, glob = classify_heads(spans, cfg.head_fraction)
    a_loc, a_glob = class_maps(maps, loc, glob)
    w, f = waad(a_loc, p, cfg.window), fai(a_glob, p, cfg.fai_min, cfg.fai_max)
    sel = credit_selection(w, f, cfg)
    return {
        "spans": spans,
        "local_heads": loc,
        "global_heads": glob,
        "waad": w,
        "fai": f,
        "gamma": sel.gamma,
        "delta": sel.delta,
        "local": sel.local,
        "anchors": sel.anchors,
        "dominated": sel.dominated,
        "introducer": sel.introducer,
    }


def padded_maps(
    prompts: list[int], lengths: list[int], layers: int = 2, heads: int = 3, seed: int = 0
) -> tuple[torch.Tensor, int]:
    """Right-padded float32 maps [B, layers, H, N - q0, N] like ActorAttention's, q0 = min prompt.

    Each sample's rows are its own causal maps; the rows no sample owns (pad
    positions) are NaN, so any leak of padding into a result shows.
    """
    n, q0 = max(lengths), min(prompts)
    out = torch.full((len(lengths), layers, heads, n, n), math.nan)
    for b, length in enumerate(lengths):
        out[b, ..., :length, :] = 0.0
        out[b, ..., :length, :length] = causal_maps(layers, heads, length, seed=seed + b).float()
    return out[..., q0:, :], q0


BATCH_CONFIGS = [
    {"credit": "none"},
    {"credit": "local"},
    {"credit": "local", "top_q": 0.25, "window": 3, "head_fraction": 0.5},
    {"credit": "global"},
    {"credit": "global", "fai_min": 2, "fai_max": 6},
    {"credit": "coupled"},
    {"credit": "coupled", "fai_min": 2, "fai_max": 9, "lookback": 2},
    {"credit": "coupled", "fai_min": 1, "fai_max": 4, "alpha": 1.0, "top_q": 0.6},
    {"credit": "coupled", "fai_min": 3, "tau_waad": 3.0, "tau_delta": 0.5},
]


@pytest.mark.parametrize("both_signs", [True, False])
@pytest.mark.parametrize("overrides", BATCH_CONFIGS)
def test_batched_credit_equals_per_sample(overrides: dict, both_signs: bool) -> None:
    """Mixed prompt and response lengths (1 to 17 tokens) in one padded batch."""
    cfg = RhythmConfig(both_signs=both_signs, **overrides)
    prompts = [4, 6, 3, 6, 9, 5, 3, 7]
    responses = [3, 1, 17, 2, 12, 8, 4, 6]
    lengths = [p + r for p, r in zip(prompts, responses, strict=True)]
    maps, q0 = padded_maps(prompts, lengths, seed=len(str(overrides)))
    got = rhythm_credit_batch(maps, torch.tensor(prompts), torch.tensor(lengths), cfg)
    assert got.gamma.shape == got.valid.shape == (8, 17)
    assert got.valid.sum(1).tolist() == responses
    assert torch.isfinite(got.gamma).all() and torch.isfinite(got.waad).all()
    assert (got.gamma[~got.valid] == 1).all()
    if cfg.credit == "coupled":  # the hand-over itself is exercised, not only the anchors
        assert got.selection.dominated.any()
    gammas = got.gammas()
    for b, (p, length) in enumerate(zip(prompts, lengths, strict=True)):
        ref = per_sample(maps[b, :, :, p - q0 : length - q0, :length], p, cfg)
        r = responses[b]
        assert torch.allclose(gammas[b], ref["gamma"], atol=1e-6, rtol=0)
        for name in ("waad", "fai", "delta"):
            row = getattr(got.selection if name == "delta" else got, name)[b]
            # Same sums in another order: equal up to float32 rounding.
            assert torch.allclose(row[:r], ref[name], atol=1e-6, rtol=1e-6), name
        assert torch.allclose(got.spans[b], ref["spans"], atol=1e-6, rtol=1e-6)
        assert torch.equal(got.local_heads[b], ref["local_heads"])
        assert torch.equal(got.global_heads[b], ref["global_heads"])
        for name in ("local", "anchors", "dominated", "introducer"):
            assert torch.equal(getattr(got.selection, name)[b, :r], ref[name]), name

    # The shaped advantages, with either sign rule, are the same too.
    width = max(lengths) - 1
    mask = torch.zeros(8, width)
    for b, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        mask[b, p - 1 : p - 1 + r] = 1.0
    adv = torch.randn(8, width, generator=torch.Generator().manual_seed(5))
    refs = [
        per_sample(maps[b, :, :, p - q0 : n - q0, :n], p, cfg)["gamma"]
        for b, (p, n) in enumerate(zip(prompts, lengths, strict=True))
    ]
    assert torch.allclose(
        shape_advantages(adv, gammas, mask, both_signs),
        shape_advantages(adv, refs, mask, both_signs),
        atol=1e-6,
        rtol=0,
    )


def test_batched_credit_whole_maps_and_empty_response() -> None:
    """Whole maps (rows = N) work too, and a response of 0 tokens gets no gammas."""
    prompts, lengths = [0, 3, 5], [9, 7, 5]
    maps, q0 = padded_maps([0, 3, 5], lengths, seed=3)
    assert q0 == 0 and maps.shape[-2] == maps.shape[-1] == 9
    cfg = RhythmConfig(credit="coupled", fai_min=2)
    got = rhythm_credit_batch(maps, torch.tensor(prompts), torch.tensor(lengths), cfg)
    assert [g.numel() for g in got.gammas()] == [9, 4, 0]
    for b in range(2):
        ref = per_sample(maps[b, ..., : lengths[b], : lengths[b]], prompts[b], cfg)
        assert torch.equal(got.gammas()[b], ref["gamma"])
    with pytest.raises(ValueError, match="response_start"):
        rhythm_credit_batch(maps[..., 2:, :], torch.tensor(prompts), torch.tensor(lengths), cfg)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.integers(1, 12), min_size=1, max_size=6),
    credit=st.sampled_from(["none", "local", "global", "coupled"]),
    top_q=st.sampled_from([0.1, 0.4, 0.5, 0.6, 1.0]),
    lookback=st.integers(1, 4),
    alpha=st.sampled_from([0.0, 0.5, 1.0]),
    taus=st.sampled_from([("median", "median"), (1.0, 0.5), (0.0, "median")]),
    seed=st.integers(0, 10_000),
)
def test_batched_selection_equals_per_sample_with_ties(
    rows, credit, top_q, lookback, alpha, taus, seed
) -> None:
    """Quarter-step WAAD and FAI values, so ties and zero scores are common."""
    cfg = RhythmConfig(
        credit=credit,
        top_q=top_q,
        lookback=lookback,
        alpha=alpha,
        tau_waad=taus[0],
        tau_delta=taus[1],
    )
    g = torch.Generator().manual_seed(seed)
    r_max = max(rows)
    w = torch.randint(0, 8, (len(rows), r_max), generator=g).float() / 4
    f = torch.randint(0, 4, (len(rows), r_max), generator=g).float() / 4
    valid = torch.arange(r_max) < torch.tensor(rows)[:, None]
    got = credit_selection_batch(w, f, valid, cfg)
    for b, r in enumerate(rows):
        ref = credit_selection(w[b, :r], f[b, :r], cfg)
        for name in ("gamma", "delta", "local", "anchors", "dominated", "introducer"):
            assert torch.equal(getattr(got, name)[b, :r], getattr(ref, name)), name
        assert (got.gamma[b, r:] == 1).all() and (got.introducer[b, r:] == -1).all()
