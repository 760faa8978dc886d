"""A picture of attention-rhythm credit over one response (SPEC section 3).

Three panels share the token axis:

1. WAAD per response token (local heads) and Delta_t = |WAAD_t - WAAD_{t+1}|,
   with the local-chunk tokens (top-q Delta) and the introducers of dominated
   anchors marked; in coupled mode the tau_waad / tau_Delta thresholds are
   drawn as dotted lines.
2. FAI per token (global heads), with the global anchors (top-q FAI) and the
   locally dominated anchors marked.
3. gamma per token as bars rising from 1, coloured by why the token was
   amplified; arrows run from each dominated anchor to the token it hands a
   share of its credit to.

The x axis is labelled with the response tokens, each decoded on its own
(`token_labels`), thinned out when there are too many to read.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from cadence.algo.rhythm import CreditMode, RhythmConfig, coupled_thresholds

SPACE = "\u2423"  # open box: a visible space
COLORS = {
    "waad": "tab:blue",
    "delta": "tab:orange",
    "fai": "tab:purple",
    "local": "tab:orange",
    "anchor": "tab:red",
    "dominated": "darkred",
    "introducer": "tab:green",
    "plain": "lightgrey",
}


def token_label(text: str, max_chars: int = 12) -> str:
    """A readable tick label for one decoded token: escapes shown, edge spaces made visible."""
    if text == "":
        return "\u2205"  # empty set: a token that decodes to nothing
    body = text if text.isprintable() else repr(text)[1:-1]
    stripped = body.strip(" ")
    lead = len(body) - len(body.lstrip(" "))
    trail = len(body) - len(body.rstrip(" "))
    body = SPACE * lead + stripped + SPACE * trail if stripped else SPACE * len(body)
    return body if len(body) <= max_chars else body[: max_chars - 1] + "\u2026"


def token_labels(tokenizer, ids: list[int]) -> list[str]:
    """Each id decoded on its own (`tokenizer.decode([id])`) and made tick-safe."""
    return [token_label(tokenizer.decode([int(i)])) for i in ids]


def _short(text: str, limit: int = 70) -> str:
    text = repr(text)[1:-1]
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _mark(
    ax: Any, x: Any, y: torch.Tensor, where: torch.Tensor, marker: str, size: int, color: str, zorder: int, label: str
) -> None:
    """Black-edged markers on the curve `y` at the positions `where` (nothing, no legend entry, if none)."""
    if where.any():
        ax.scatter(
            x[where.numpy()],
            y[where].numpy(),
            marker=marker,
            s=size,
            color=color,
            edgecolor="black",
            linewidths=0.6,
            zorder=zorder,
            label=label,
        )


def plot_rhythm(
    path: str | Path,
    labels: list[str],
    gamma: torch.Tensor,
    info: dict[str, Any],
    credit: CreditMode,
    cfg: RhythmConfig,
    prompt: str = "",
    checkpoint: str = "",
    dpi: int = 110,
) -> Path:
    """Write the 3-panel rhythm PNG for one response; returns `path`.

    `gamma` and `info` are what `ActorAttention.token_credit` returns for the
    rule `credit` and constants `cfg`; `labels` has one entry per response
    token (see `token_labels`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    w = info["waad"].float()
    f = info["fai"].float()
    d = info["delta"].float()
    g = gamma.float().cpu()
    r = g.numel()
    if not (w.numel() == f.numel() == d.numel() == len(labels) == r):
        raise ValueError(
            f"plot_rhythm: {r} gammas, {len(labels)} labels, {w.numel()} WAAD, {f.numel()} FAI"
        )
    local = info["local"].bool()
    anchors = info["anchors"].bool()
    dominated = info["dominated"].bool()
    introducer = info["introducer"].long()
    intro_mask = torch.zeros(r, dtype=torch.bool)
    intro_mask[introducer[dominated]] = True
    x = torch.arange(r).numpy()

    width = min(max(9.0, 0.14 * r + 3.5), 36.0)
    fig, (ax_w, ax_f, ax_g) = plt.subplots(
        3, 1, figsize=(width, 8.5), dpi=dpi, sharex=True, height_ratios=[3, 2.2, 2]
    )
    amplified = (g > 1.0).numpy()
    for ax in (ax_w, ax_f):
        for i in x[amplified]:
            ax.axvspan(i - 0.5, i + 0.5, color="gold", alpha=0.12, linewidth=0)

    # 1. WAAD and Delta
    ax_w.plot(x, w.numpy(), "-o", color=COLORS["waad"], ms=2.5, lw=1.3, label="WAAD (local heads)")
    ax_w.plot(
        x,
        d.numpy(),
        "--",
        color=COLORS["delta"],
        lw=1.0,
        label="\u0394 = |WAAD[t] \u2212 WAAD[t+1]|",
    )
    _mark(ax_w, x, d, local, "^", 60, COLORS["local"], 5, "local chunk (top-q \u0394)")
    _mark(ax_w, x, d, intro_mask, "D", 45, COLORS["introducer"], 6, "introducer of a dominated anchor")
    if credit == "coupled" and r > 1:
        # The thresholds credit_selection used: this response as a batch of one.
        taus = coupled_thresholds(w[None], d[None], torch.ones(1, r, dtype=torch.bool), cfg)
        tau_w, tau_d = (float(torch.as_tensor(tau).flatten()[0]) for tau in taus)
        ax_w.axhline(tau_w, color=COLORS["waad"], ls=":", lw=1, label=f"\u03c4_WAAD = {tau_w:.2f}")
        ax_w.axhline(
            tau_d, color=COLORS["delta"], ls=":", lw=1, label=f"\u03c4_\u0394 = {tau_d:.2f}"
        )
    ax_w.set_ylabel(f"WAAD / \u0394  (W = {cfg.window})")
    ax_w.set_ylim(bottom=0)

    # 2. FAI
    ax_f.plot(x, f.numpy(), "-o", color=COLORS["fai"], ms=2.5, lw=1.3, label="FAI (global heads)")
    plain_anchor = anchors & ~dominated
    _mark(ax_f, x, f, plain_anchor, "o", 50, COLORS["anchor"], 5, "global anchor (top-q FAI)")
    _mark(ax_f, x, f, dominated, "X", 80, COLORS["dominated"], 6, "locally dominated anchor")
    ax_f.set_ylabel(f"FAI  (t\u2212s in [{cfg.fai_min}, {cfg.fai_max}])")
    positive = f[f > 0]
    if positive.numel() == 0:
        ax_f.set_ylim(0, 1)
        ax_f.text(
            0.5,
            0.5,
            f"FAI is 0 everywhere: no token has a later token {cfg.fai_min}+ positions ahead",
            transform=ax_f.transAxes,
            ha="center",
            va="center",
            fontsize=9,
            color="grey",
        )
    elif float(positive.max()) > 30 * float(positive.median()):
        # One token (often the first, an attention sink) would flatten the rest.
        ax_f.set_yscale("log", nonpositive="mask")
        ax_f.set_ylabel(ax_f.get_ylabel() + "\nlog scale, 0 not drawn", fontsize=9)
    else:
        ax_f.set_ylim(bottom=0)

    # 3. gamma
    colors = []
    for i in range(r):
        if dominated[i]:
            colors.append(COLORS["dominated"])
        elif anchors[i]:
            colors.append(COLORS["anchor"])
        elif local[i]:
            colors.append(COLORS["local"])
        elif intro_mask[i]:
            colors.append(COLORS["introducer"])
        else:
            colors.append(COLORS["plain"])
    edges = [COLORS["introducer"] if intro_mask[i] else "none" for i in range(r)]
    ax_g.bar(
        x, (g - 1.0).numpy(), bottom=1.0, width=0.8, color=colors, edgecolor=edges, linewidth=1.5
    )
    ax_g.axhline(1.0, color="black", lw=0.8)
    ax_g.axhline(cfg.gamma_amp, color="grey", ls="--", lw=0.8)
    top = max(cfg.gamma_amp, float(g.max())) if r else cfg.gamma_amp
    for a in torch.nonzero(dominated).flatten().tolist():
        i = int(introducer[a])
        ax_g.annotate(
            "",
            xy=(i, float(g[i])),
            xytext=(a, float(g[a])),
            arrowprops=dict(
                arrowstyle="->", color=COLORS["introducer"], lw=1, connectionstyle="arc3,rad=-0.5"
            ),
        )
    ax_g.set_ylim(1.0 - 0.08 * (top - 1.0 + 0.1), top + 0.25 * (top - 1.0 + 0.1))
    ax_g.set_ylabel("\u03b3 (advantage \u00d7)")
    handles = [
        Patch(color=COLORS["local"], label="local chunk"),
        Patch(color=COLORS["anchor"], label="global anchor"),
        Patch(
            color=COLORS["dominated"],
            label=f"dominated anchor (keeps 1\u2212\u03b1, \u03b1={cfg.alpha})",
        ),
        Patch(
            facecolor=COLORS["introducer"],
            edgecolor=COLORS["introducer"],
            label="introducer (gains \u03b1 share)",
        ),
        Line2D([], [], color="grey", ls="--", lw=0.8, label=f"\u03b3_amp = {cfg.gamma_amp}"),
    ]
    present = [local.any(), plain_anchor.any(), dominated.any(), intro_mask.any(), True]
    ax_g.legend(
        handles=[h for h, keep in zip(handles, present, strict=True) if keep],
        loc="upper left",
        bbox_to_anchor=(1.005, 1.0),
        fontsize=8,
        frameon=False,
    )
    for ax in (ax_w, ax_f):
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
        ax.grid(alpha=0.25)
    ax_g.grid(alpha=0.25, axis="y")

    # x axis: decoded tokens below, token indices on top
    usable = max(1.0, width - 3.5)
    max_labels = max(10, int(usable / 0.13))
    step = max(1, math.ceil(r / max_labels))
    ticks = list(range(0, r, step))
    ax_g.set_xticks(ticks)
    ax_g.set_xticklabels([labels[i] for i in ticks], rotation=90, fontsize=7, family="monospace")
    for lab in ax_g.get_xticklabels():
        lab.set_parse_math(False)
    ax_g.set_xticks(range(r), minor=True)
    ax_g.set_xlim(-0.6, r - 0.4)
    ax_g.set_xlabel("response token" + (f" (every {step}th labelled)" if step > 1 else ""))
    top_axis = ax_w.secondary_xaxis("top")
    top_axis.set_xlabel("response token index", fontsize=8)
    top_axis.tick_params(labelsize=7)
    top_axis.xaxis.set_major_locator(MaxNLocator(integer=True))

    n_local = len(info.get("local_heads", []))
    n_global = len(info.get("global_heads", []))
    head = f"{checkpoint}  |  credit = {credit}" if checkpoint else f"credit = {credit}"
    title = (
        f"{head}  |  prompt: {_short(prompt)}\n"
        f"{r} tokens, {amplified.mean():.0%} amplified, mean \u03b3 {float(g.mean()):.3f}  |  "
        f"layers {info.get('layers', '?')}, {n_local} local / {n_global} global heads, "
        f"top_q = {cfg.top_q}"
    )
    fig.suptitle(title, fontsize=10, parse_math=False)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
