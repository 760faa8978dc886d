"""Attention-rhythm math: metrics against direct loops, head classes, credit rules, padding."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cadence.algo.rhythm import (
    BatchLayout,
    CreditSelection,
    RhythmConfig,
    batch_layout,
    class_maps,
    classify_heads,
    credit_selection,
    fai,
    head_spans,
    local_delta,
    rhythm_credit,
    select_layers,
    top_q_mask,
    waad,
)


def causal_maps(*shape: int, seed: int = 0) -> torch.Tensor:
    """Random row-stochastic causal attention maps [..., N, N] (float64 for exact loops)."""
    g = torch.Generator().manual_seed(seed)
    n = shape[-1]
    logits = torch.randn(*shape, n, generator=g, dtype=torch.float64) * 2
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    return logits.masked_fill(future, -math.inf).softmax(-1)


# ----------------------------------------------------------------------------
# One sequence is a batch of one: these wrap the batched functions, no formula of their own.


def layout_of(a: torch.Tensor, p: int) -> BatchLayout:
    """Layout of one sequence whose map(s) `a` [..., rows, N] are whole (rows = N) or response rows."""
    one = a.reshape(-1, *a.shape[-2:])[None, :1, None]  # [1, 1, 1, rows, N]
    return batch_layout(one, torch.tensor([p]), torch.tensor([a.shape[-1]]))


def waad1(a: torch.Tensor, p: int, w: int = 10) -> torch.Tensor:
    return waad(a.float()[None], layout_of(a, p), w)[0]


def fai1(a: torch.Tensor, p: int, h_min: int = 10, h_max: int = 100) -> torch.Tensor:
    return fai(a.float()[None], layout_of(a, p), h_min, h_max)[0]


def spans1(heads: torch.Tensor, p: int) -> torch.Tensor:
    """head_spans of one sequence's maps [layers, H, rows, N] -> [layers, H]."""
    return head_spans(heads.float()[None], layout_of(heads, p))[0]


def select1(
    w: torch.Tensor, f: torch.Tensor, credit: str, trained: list[bool] | None = None, **cfg
) -> CreditSelection:
    """credit_selection of one response's WAAD and FAI [R]; fields [R]."""
    valid = torch.ones(1, w.numel(), dtype=torch.bool)
    mask = None if trained is None else torch.tensor([trained])
    sel = credit_selection(w[None], f[None], valid, credit, RhythmConfig(**cfg), mask)
    return CreditSelection(*(getattr(sel, f.name)[0] for f in dataclasses.fields(sel)))


def gamma1(
    w: torch.Tensor, f: torch.Tensor, credit: str, trained: list[bool] | None = None, **cfg
) -> list[float]:
    return select1(w, f, credit, trained, **cfg).gamma.tolist()


def top1(score: torch.Tensor, q: float) -> torch.Tensor:
    return top_q_mask(score[None], torch.ones(1, score.numel(), dtype=torch.bool), q)[0]


def delta1(w: torch.Tensor) -> torch.Tensor:
    return local_delta(w[None], torch.ones(1, w.numel(), dtype=torch.bool))[0]


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
    assert torch.allclose(waad1(a, p, 10), torch.tensor(loop_waad(a, p, 10), dtype=torch.float32))
    assert torch.allclose(
        fai1(a, p, 10, 100), torch.tensor(loop_fai(a, p, 10, 100), dtype=torch.float32)
    )
    assert torch.allclose(fai1(a, p, 3, 8), torch.tensor(loop_fai(a, p, 3, 8), dtype=torch.float32))
    heads = causal_maps(2, 3, n, seed=seed + 100)
    spans = spans1(heads, p)
    assert spans.shape == (2, 3)
    expected = torch.tensor([[loop_span(heads[lay, h], p) for h in range(3)] for lay in range(2)])
    assert torch.allclose(spans, expected.float(), atol=1e-5)


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
    got_w, got_f = waad1(a, p, w), fai1(a, p, h_min, h_min + h_len)
    assert got_w.shape == got_f.shape == (n - p,)
    assert torch.isfinite(got_w).all() and torch.isfinite(got_f).all()
    assert torch.allclose(got_w, torch.tensor(loop_waad(a, p, w), dtype=torch.float32), atol=1e-6)
    assert torch.allclose(
        got_f, torch.tensor(loop_fai(a, p, h_min, h_min + h_len), dtype=torch.float32), atol=1e-6
    )
    assert math.isclose(
        float(spans1(a[None, None], p)), loop_span(a, p), rel_tol=1e-5, abs_tol=1e-6
    )


def test_response_rows_give_same_metrics() -> None:
    """Maps of response rows only ([N-p, N], what ActorAttention returns) read like whole maps."""
    n, p = 25, 9
    a = causal_maps(n, seed=3)
    assert torch.equal(waad1(a, p), waad1(a[p:], p))
    assert torch.equal(fai1(a, p, 2, 9), fai1(a[p:], p, 2, 9))
    assert torch.equal(spans1(a[None, None], p), spans1(a[None, None, p:], p))
    with pytest.raises(ValueError, match="response_start"):
        waad1(a[p + 1 :], p)


def test_short_responses_have_no_nan() -> None:
    """R = 1 and R below every window: all metrics finite, FAI 0 where no future is in range."""
    for n, p in [(5, 4), (12, 4), (1, 0)]:
        a = causal_maps(n, seed=n)
        w, f = waad1(a, p, 10), fai1(a, p, 10, 100)
        assert torch.isfinite(w).all() and torch.isfinite(f).all()
        assert (f == 0).all()  # R <= 10: no t with t - s >= 10
        for mode in ["none", "local", "global", "coupled"]:
            g = torch.tensor(gamma1(w, f, mode))
            assert g.shape == (n - p,) and torch.isfinite(g).all() and (g >= 1).all()
    # R = 1: Delta is 0 (no successor), so local never fires; FAI from real maps is 0 too.
    one = torch.tensor([0.7])
    assert gamma1(one, torch.zeros(1), "local") == [1.0]
    assert gamma1(one, torch.zeros(1), "coupled") == [1.0]


def test_waad_is_capped_and_first_token_zero() -> None:
    n = 30
    a = torch.zeros(n, n)
    a[:, 0] = 1.0  # every token attends to position 0 only
    w = waad1(a, 0, w=10)
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
    def classes(spans: torch.Tensor, fraction: float) -> tuple[list[int], list[int]]:
        local, glob = classify_heads(spans[None], fraction)  # a batch of one
        return local[0].tolist(), glob[0].tolist()

    spans = torch.tensor([[5.0, 1.0, 9.0, 3.0, 7.0], [2.0, 8.0, 4.0, 6.0, 0.0]])
    local, glob = classes(spans, 0.3)  # floor(0.3 * 10) = 3 each
    assert local == [9, 1, 5]  # spans 0, 1, 2
    assert glob == [2, 6, 4]  # spans 9, 8, 7
    local, glob = classes(spans, 0.5)
    assert len(local) == len(glob) == 5 and set(local).isdisjoint(glob)
    assert classes(torch.arange(4.0), 0.3) == ([0], [3])  # floor(1.2) = 1
    assert classes(torch.tensor([2.0]), 0.3) == ([0], [0])  # one head is both classes
    assert classes(torch.ones(6), 0.3)[0] == [0]  # ties keep the earlier head
    # Each sample of a batch ranks its own heads.
    local, glob = classify_heads(torch.stack([spans, -spans]), 0.3)
    assert local.tolist() == [[9, 1, 5], [2, 6, 4]] and glob.tolist() == [[2, 6, 4], [9, 1, 5]]


def test_class_maps_average_their_heads() -> None:
    maps = causal_maps(2, 3, 8, seed=1)
    a_loc, a_glob = class_maps(maps[None], torch.tensor([[0, 4]]), torch.tensor([[5]]))
    assert torch.allclose(a_loc[0], ((maps[0, 0] + maps[1, 1]) / 2).float())
    assert torch.allclose(a_glob[0], maps[1, 2].float())
    assert torch.allclose(a_loc[0].sum(-1), torch.ones(8))


# ----------------------------------------------------------------------------
# Credit rules, by hand


def test_top_q_mask_ceil_positive_and_ties() -> None:
    score = torch.tensor([0.1, 0.5, 0.2, 0.5, 0.0])
    assert top1(score, 0.4).tolist() == [False, True, False, True, False]  # k = 2
    assert top1(score, 0.2).tolist() == [False, True, False, False, False]  # tie -> earlier
    assert top1(score, 0.5).tolist() == [False, True, True, True, False]  # ceil(2.5) = 3
    assert top1(score, 1.0).sum() == 4  # the zero score is never selected
    assert top1(torch.ones(5), 0.6).sum() == 3  # 0.6 * 5 is 3.0000000000000004 in floats
    assert top1(torch.ones(3), 0.1).sum() == 1  # ceil: a short response still gets one


def test_local_delta() -> None:
    assert delta1(torch.tensor([0.0, 1.0, 1.0, 4.0, 4.0])).tolist() == [1.0, 0.0, 3.0, 0.0, 0.0]
    assert delta1(torch.tensor([2.0])).tolist() == [0.0]


def test_credit_none_local_global() -> None:
    w = torch.tensor([0.0, 1.0, 1.0, 4.0, 4.0])  # Delta = [1, 0, 3, 0, 0]
    f = torch.tensor([0.1, 0.5, 0.2, 0.5, 0.0])
    assert gamma1(w, f, "none") == [1.0] * 5
    assert gamma1(w, f, "local") == [1.5, 1.0, 1.5, 1.0, 1.0]  # k = 2: Delta 3 and 1
    # q = 0.6 -> k = 3, but the third-best Delta is 0: not a boundary, not selected.
    assert gamma1(w, f, "local", top_q=0.6) == [1.5, 1.0, 1.5, 1.0, 1.0]
    assert gamma1(w, f, "global", gamma_amp=2.0) == [1.0, 2.0, 1.0, 2.0, 1.0]
    with pytest.raises(ValueError, match="credit"):
        gamma1(w, f, "all")


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
    sel = select1(w, f, "coupled")
    assert sel.gamma.tolist() == [1.25, 1.5, 1.25, 1.25, 1.25, 1.0]
    assert sel.anchors.tolist() == [False, True, False, True, True, False]
    assert sel.dominated.tolist() == [False, False, False, True, True, False]
    assert sel.introducer.tolist() == [-1, -1, -1, 0, 2, -1]
    # total amplification is conserved: 3 anchors x 0.5
    assert math.isclose(float((sel.gamma - 1).sum()), 1.5)

    # Numeric thresholds: nothing is dominated with tau_waad below every WAAD -> global rule.
    assert gamma1(w, f, "coupled", tau_waad=-1.0) == [1.0, 1.5, 1.0, 1.5, 1.5, 1.0]
    # alpha = 1 hands everything over; tau_delta = 3.5 drops anchor 4 (its window max is 3).
    full = gamma1(w, f, "coupled", alpha=1.0, tau_delta=3.5)
    assert full == [1.5, 1.5, 1.0, 1.0, 1.5, 1.0]


def test_only_trained_tokens_are_ranked_and_credited() -> None:
    # The coupled example above with tokens 2 and 3 an observation (loss mask 0), as in an
    # agentic episode. Delta is still read over all six: [4, 0, 3, 0, 4, 0].
    # FAI top ceil(0.4 * 4 trained) = 2 among tokens 0, 1, 4, 5: anchors 4 (0.8) and 1 (0.1);
    # token 3 (FAI 0.9) is an observation and takes no slot.
    w = torch.tensor([0.0, 4.0, 4.0, 1.0, 1.0, 5.0])
    f = torch.tensor([0.0, 0.1, 0.0, 0.9, 0.8, 0.05])
    trained = [True, True, False, False, True, True]
    assert gamma1(w, f, "global", trained) == [1.0, 1.5, 1.0, 1.0, 1.5, 1.0]
    assert gamma1(w, f, "local", trained) == [1.5, 1.0, 1.0, 1.0, 1.5, 1.0]  # Delta 4 at 0 and 4
    # Medians over trained tokens: tau_waad = median [0, 4, 1, 5] = 2.5; tau_Delta = median of
    # Delta at 0, 1, 4 (5 is last) = [4, 0, 4] -> 4. Anchor 4 (WAAD 1) looks back at 3 and 2,
    # observations, and 1 (Delta 0 < 4): not dominated. Without the mask tau_Delta is 3 and
    # anchor 4 hands a share to token 2, an observation.
    sel = select1(w, f, "coupled", trained)
    assert sel.gamma.tolist() == [1.0, 1.5, 1.0, 1.0, 1.5, 1.0] and not sel.dominated.any()
    assert select1(w, f, "coupled").introducer.tolist()[4] == 2
    # tau_Delta = 0: anchor 4 is dominated; its introducer is the best *trained* token back,
    # 1 (Delta 0), not 2 (Delta 3): the share stays where the loss is, the total conserved.
    sel = select1(w, f, "coupled", trained, tau_delta=0.0)
    assert sel.introducer.tolist() == [-1, -1, -1, -1, 1, -1]
    assert sel.gamma.tolist() == [1.0, 1.75, 1.0, 1.0, 1.25, 1.0]
    assert math.isclose(float((sel.gamma - 1).sum()), 1.0)
    # Every look-back is an observation: never dominated, even with tau_Delta = -inf.
    sel = select1(torch.tensor([0.0, 5.0, 1.0]), torch.tensor([0.0, 0.0, 1.0]), "coupled",
                  [False, False, True], tau_delta=-math.inf, tau_waad=9.0)
    assert sel.gamma.tolist() == [1.0, 1.0, 1.5] and not sel.dominated.any()
    with pytest.raises(ValueError, match="trained"):
        credit_selection(w[None], f[None], torch.ones(1, 6, dtype=torch.bool), "global",
                         RhythmConfig(), torch.ones(1, 5, dtype=torch.bool))


def test_coupled_introducer_ties_nearest_and_accumulates() -> None:
    # Delta = [2, 2, 0, 0]; anchors 2 and 3 (top FAI, q = 0.5); low WAAD, tau_delta 1.
    w = torch.tensor([1.0, 3.0, 1.0, 1.0])
    f = torch.tensor([0.0, 0.0, 0.9, 0.8])
    cfg = {"top_q": 0.5, "tau_waad": 1.0, "tau_delta": 1.0}
    sel = select1(w, f, "coupled", **cfg)
    # anchor 2 looks back at Delta_1 = 2, Delta_0 = 2: tie -> nearest, introducer 1.
    # anchor 3 looks back at Delta_2 = 0, Delta_1 = 2, Delta_0 = 2 -> introducer 1.
    assert sel.introducer.tolist() == [-1, -1, 1, 1]
    assert sel.gamma.tolist() == [1.0, 1.5, 1.25, 1.25]
    # The first response token has no look-back window: an anchor there is never dominated,
    # even when every look-back passes (tau_delta = -inf).
    for tau_delta in (1.0, -math.inf):
        cfg["tau_delta"] = tau_delta
        sel = select1(torch.tensor([0.0, 5.0]), torch.tensor([1.0, 0.0]), "coupled", **cfg)
        assert sel.gamma.tolist() == [1.5, 1.0] and not sel.dominated.any()


def test_coupled_tau_delta_median_leaves_out_the_last_token() -> None:
    # Delta = [0, 0.75, 1, 2, 0 (last, artificial)]: tau_Delta = median [0, 0.75, 1, 2] = 0.875
    # (with the last 0 it would be 0.75). lookback 1; anchors 2 and 4 (top 2 FAI).
    #   anchor 2: Delta_1 = 0.75 < 0.875, keeps 1.5.  anchor 4: Delta_3 = 2, introducer 3.
    w = torch.tensor([1.0, 1.0, 1.75, 0.75, 2.75])
    f = torch.tensor([0.0, 0.0, 0.9, 0.0, 0.8])
    sel = select1(w, f, "coupled", lookback=1, tau_waad=5.0)
    assert sel.gamma.tolist() == [1.0, 1.0, 1.5, 1.25, 1.25]
    assert sel.introducer.tolist() == [-1, -1, -1, -1, 3]


# ----------------------------------------------------------------------------
# Padded batches: each row reads as that sample alone, so padding never leaks


def padded_maps(
    prompts: list[int], lengths: list[int], layers: int = 2, heads: int = 3, seed: int = 0
) -> tuple[torch.Tensor, int]:
    """Right-padded float32 maps [B, layers, H, N - q0, N] (q0 = min prompt), pad rows NaN."""
    n, q0 = max(lengths), min(prompts)
    out = torch.full((len(lengths), layers, heads, n, n), math.nan)
    for b, length in enumerate(lengths):
        out[b, ..., :length, :] = 0.0
        out[b, ..., :length, :length] = causal_maps(layers, heads, length, seed=seed + b).float()
    return out[..., q0:, :], q0


BATCH_CONFIGS = [
    ("none", {}),
    ("local", {}),
    ("local", {"top_q": 0.25, "window": 3, "head_fraction": 0.5}),
    ("global", {}),
    ("global", {"fai_min": 2, "fai_max": 6}),
    ("coupled", {}),
    ("coupled", {"fai_min": 2, "fai_max": 9, "lookback": 2}),
    ("coupled", {"fai_min": 1, "fai_max": 4, "alpha": 1.0, "top_q": 0.6}),
    ("coupled", {"fai_min": 3, "tau_waad": 3.0, "tau_delta": 0.5}),
]


@pytest.mark.parametrize(("credit", "overrides"), BATCH_CONFIGS)
def test_padded_batch_rows_match_loops_and_batch_of_one(credit: str, overrides: dict) -> None:
    """Mixed prompt and response lengths (1 to 17 tokens) in one padded batch with NaN padding."""
    cfg = RhythmConfig(**overrides)
    prompts = [4, 6, 3, 6, 9, 5, 3, 7]
    responses = [3, 1, 17, 2, 12, 8, 4, 6]
    lengths = [p + r for p, r in zip(prompts, responses, strict=True)]
    maps, q0 = padded_maps(prompts, lengths, seed=len(str(overrides)))
    got = rhythm_credit(maps, torch.tensor(prompts), torch.tensor(lengths), credit, cfg)
    assert got.gamma.shape == got.valid.shape == (8, 17)
    assert got.valid.sum(1).tolist() == responses
    assert torch.isfinite(got.gamma).all() and torch.isfinite(got.waad).all()
    assert (got.gamma[~got.valid] == 1).all() and (got.selection.introducer[~got.valid] == -1).all()
    if credit == "coupled":  # the hand-over itself is exercised, not only the anchors
        assert got.selection.dominated.any()
    gammas, heads, horizon = (
        got.gammas(),
        (got.local_heads, got.global_heads),
        (cfg.fai_min, cfg.fai_max),
    )
    for b, (p, n) in enumerate(zip(prompts, lengths, strict=True)):
        own = maps[b, :, :, p - q0 : n - q0, :n]  # this sample's response rows, unpadded
        r = responses[b]
        # Against the SPEC loops (which index rows by position), on the heads this row picked.
        whole = torch.zeros(2, 3, n, n, dtype=torch.float64)
        whole[..., p:, :] = own
        spans = [[loop_span(whole[lay, h], p) for h in range(3)] for lay in range(2)]
        assert torch.allclose(got.spans[b], torch.tensor(spans).float(), atol=1e-6, rtol=1e-5)
        a_loc, a_glob = (whole.flatten(0, 1)[got_heads[b]].mean(0) for got_heads in heads)
        ref_waad, ref_fai = loop_waad(a_loc, p, cfg.window), loop_fai(a_glob, p, *horizon)
        assert torch.allclose(got.waad[b, :r], torch.tensor(ref_waad).float(), atol=1e-6)
        assert torch.allclose(got.fai[b, :r], torch.tensor(ref_fai).float(), atol=1e-6)
        # Against the same sample alone (a batch of one): padding changes nothing, up to the
        # float summation order over N columns.
        alone = rhythm_credit(own[None], torch.tensor([p]), torch.tensor([n]), credit, cfg)
        assert torch.allclose(gammas[b], alone.gammas()[0], atol=1e-6, rtol=0)
        assert torch.allclose(got.selection.delta[b, :r], alone.selection.delta[0], atol=1e-6)
        for name in ("local", "anchors", "dominated", "introducer"):
            row, ref = getattr(got.selection, name)[b, :r], getattr(alone.selection, name)[0]
            assert torch.equal(row, ref), name


def test_whole_maps_and_empty_response() -> None:
    """Whole maps (rows = N) work too, and a response of 0 tokens gets no gammas."""
    prompts, lengths = [0, 3, 5], [9, 7, 5]
    maps, q0 = padded_maps([0, 3, 5], lengths, seed=3)
    assert q0 == 0 and maps.shape[-2] == maps.shape[-1] == 9
    cfg, start, length = RhythmConfig(fai_min=2), torch.tensor(prompts), torch.tensor(lengths)
    got = rhythm_credit(maps, start, length, "coupled", cfg)
    assert [g.numel() for g in got.gammas()] == [9, 4, 0]
    for b, (p, n) in enumerate(zip(prompts[:2], lengths, strict=False)):
        alone = rhythm_credit(maps[b : b + 1, ..., p:n, :n], [p], [n], "coupled", cfg)
        assert torch.equal(got.gammas()[b], alone.gammas()[0])
    with pytest.raises(ValueError, match="response_start"):
        rhythm_credit(maps[..., 2:, :], start, length, "coupled", cfg)


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
def test_padded_selection_equals_each_row_alone_with_ties(
    rows, credit, top_q, lookback, alpha, taus, seed
) -> None:
    """Quarter-step WAAD and FAI values, so ties and zero scores are common; padding is junk."""
    cfg = RhythmConfig(
        top_q=top_q, lookback=lookback, alpha=alpha, tau_waad=taus[0], tau_delta=taus[1]
    )
    g = torch.Generator().manual_seed(seed)
    r_max = max(rows)
    w = torch.randint(0, 8, (len(rows), r_max), generator=g).float() / 4
    f = torch.randint(0, 4, (len(rows), r_max), generator=g).float() / 4
    valid = torch.arange(r_max) < torch.tensor(rows)[:, None]
    got = credit_selection(w, f, valid, credit, cfg)
    for b, r in enumerate(rows):
        alone = credit_selection(*(x[b : b + 1, :r] for x in (w, f, valid)), credit, cfg)
        for name in ("gamma", "delta", "local", "anchors", "dominated", "introducer"):
            assert torch.equal(getattr(got, name)[b, :r], getattr(alone, name)[0]), name
        assert (got.gamma[b, r:] == 1).all() and (got.introducer[b, r:] == -1).all()
