"""The report of benchmarks/offpolicy_stability.py: the table in docs/async.md and the curves' PNG."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from cadence.observe.report import write_doc_table

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "async.md"
PLOT = ROOT / "docs" / "results" / "offpolicy_stability.png"


def _extent(meta: dict[str, Any]) -> str:
    if "partial" in meta:  # written from the resume file of a grid still running or cut short
        return f"partial grid: {meta['partial']}"
    return f"grid wall time {meta['wall_s'] / 60:.1f} min"


def markdown_table(result: dict[str, Any]) -> str:
    """Final held-out pass@1 per loss (rows) and alpha (columns), then staleness and time per alpha."""
    meta, summary = result["meta"], result["summary"]
    alphas = sorted({row["alpha"] for row in summary})
    cell = {(row["loss"], row["alpha"]): row for row in summary}
    setting = meta["setting"]
    lines = [
        f"Measured {meta['date']} on {meta['machine']} ({meta['jobs']} runs at a time, torch threads 1; "
        f"{_extent(meta)}). Held-out greedy pass@1 on {setting['test_size']} "
        f"carrying additions after {setting['steps']} steps ({setting['prompts_per_step']} prompts x "
        f"{setting['group_size']} answers, lr {setting['lr']:g}), mean ± sd over seeds "
        f"{' '.join(map(str, meta['seeds']))} (per seed in brackets); before training: "
        f"{statistics.mean(row['before'] for row in summary):.3f}. Reproduce with `{meta['command']}`; "
        "every run and curve is in `docs/results/offpolicy_stability.json`.",
        "",
        "| loss | " + " | ".join(f"alpha = {a}" for a in alphas) + " |",
        "|---|" + "---|" * len(alphas),
    ]
    for loss in dict.fromkeys(row["loss"] for row in summary):
        cells = []
        for a in alphas:
            row = cell.get((loss, a))
            cells.append(
                "–" if row is None else f"{row['after_mean']:.3f} ± {row['after_sd']:.3f} "
                f"({' / '.join(f'{x:.2f}' for x in row['per_seed'])})"
            )
        lines.append(f"| {loss} | " + " | ".join(cells) + " |")
    lines += ["", "| alpha | measured staleness (mean versions behind) | run time, s (mean over runs) |", "|---|---|---|"]
    for a in alphas:
        rows = [row for row in summary if row["alpha"] == a]
        lines.append(
            f"| {a} | {statistics.mean(r['staleness_mean'] for r in rows):.2f} | "
            f"{statistics.mean(r['wall_s'] for r in rows):.0f} |"
        )
    return "\n".join(lines + ["", metrics_table(summary)])


def _number(value: float | None, spec: str) -> str:
    return "–" if value is None or math.isnan(value) else format(value, spec)


def metrics_table(summary: list[dict[str, Any]]) -> str:
    """Per loss and alpha, beside the accuracy: the off-policy metrics (means over steps and
    seeds) and the speed, so the speed-versus-staleness curve reads with its accuracy."""
    lines = [
        "| loss | alpha | pass@1 | ESS (token) | lowest ESS | ESS (sequence) | masked share | "
        "KL(mu ‖ pi_old) | samples/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summary:
        lines.append(
            f"| {row['loss']} | {row['alpha']} | {row['after_mean']:.3f} ± {row['after_sd']:.3f} | "
            f"{_number(row.get('offpolicy/ess'), '.3f')} | {_number(row.get('ess_min'), '.3f')} | "
            f"{_number(row.get('offpolicy/ess_seq'), '.3f')} | {_number(row.get('offpolicy/masked_frac'), '.3f')} | "
            f"{_number(row.get('offpolicy/kl_mu_pi_old'), '.4f')} | {_number(row.get('samples_per_s'), '.1f')} |"
        )
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path = PLOT) -> None:
    """Held-out pass@1 against step, one panel per loss, one line per alpha (seed mean, min-max band)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, runs = result["summary"], result["runs"]
    alphas = sorted({row["alpha"] for row in summary})
    losses = list(dict.fromkeys(row["loss"] for row in summary))
    cols = min(4, len(losses))
    rows = -(-len(losses) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 2.9 * rows), sharex=True, sharey=True, squeeze=False)
    for ax, loss in zip(axes.flat, losses, strict=False):
        for k, alpha in enumerate(alphas):
            mine = [r for r in runs if r["loss"] == loss and r["alpha"] == alpha]
            if not mine:
                continue
            steps = [s for s, _ in mine[0]["curve"]]
            values = [[r["curve"][i][1] for r in mine] for i in range(len(steps))]
            ax.plot(steps, [statistics.mean(v) for v in values], color=f"C{k}", marker=".", label=f"alpha = {alpha}")
            ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values], color=f"C{k}", alpha=0.15)
        ax.set_title(loss, fontsize=9)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(losses):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("training step")
    for ax in axes[:, 0]:
        ax.set_ylabel("held-out pass@1")
    axes.flat[0].legend(fontsize=8, loc="lower right")
    fig.suptitle("Off-policy stability on carrying additions: mean of seeds, band = min-max", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(result: dict[str, Any], doc: Path = DOC, png: Path = PLOT) -> None:
    """The curves' PNG, and the table between the offpolicy markers of `doc` (docs/async.md)."""
    plot(result, png)
    write_doc_table(doc, "offpolicy", markdown_table(result))
