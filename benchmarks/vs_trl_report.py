"""The report of benchmarks/vs_trl.py: ratios to TRL, one markdown table per setting, the plot.

Results are ``{"settings": {name: {"runs": [...], "config": {...}, "start_accuracy": ...}},
"machine": ..., "versions": ...}``; every run row carries its own numbers, and
`add_ratios` adds its ratios to the TRL run of the same setting.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cadence.observe.report import write_doc_table


def add_ratios(runs: list[dict[str, Any]]) -> None:
    """Ratios to the TRL run among `runs` (when there is one), in place."""
    base = next((r for r in runs if r["run"] == "trl"), None)
    for r in runs:
        if base is None:
            r["ratios_to_trl"] = None
            continue
        r["ratios_to_trl"] = {
            "samples_per_s": r["samples_per_s"] / base["samples_per_s"],
            "tokens_per_s": r["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else None,
            "train_seconds": r["train_seconds"] / base["train_seconds"],
            "total_seconds": r["total_seconds"] / base["total_seconds"],
            "peak_rss": r["peak_rss_bytes"] / base["peak_rss_bytes"] if base["peak_rss_bytes"] else None,
            "accuracy_points": 100 * (r["accuracy"] - base["accuracy"]),
        }


def _mib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:.0f} MiB"


def _x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def markdown_table(results: dict[str, Any], setting: str) -> str:
    """The table of one setting (and a line on how it was measured) for docs/vs_trl.md."""
    block = results["settings"][setting]
    lines = [
        "| run | training s | total s | samples/s | tokens/s | x TRL samples/s | peak RSS, tree "
        "| peak PSS, tree | x TRL RSS | held-out pass@1 | vs TRL |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in block["runs"]:
        ratio = r.get("ratios_to_trl") or {}
        pts = ratio.get("accuracy_points")
        lines.append(
            f"| {r['label']} | {r['train_seconds']:.1f} | {r['total_seconds']:.1f} "
            f"| {r['samples_per_s']:.1f} | {r['tokens_per_s']:.0f} | {_x(ratio.get('samples_per_s'))} "
            f"| {_mib(r['peak_rss_bytes'])} | {_mib(r.get('peak_pss_bytes'))} | {_x(ratio.get('peak_rss'))} "
            f"| {r['accuracy']:.3f} | {'n/a' if pts is None else f'{pts:+.1f} pts'} |"
        )
    m, c, v = results["machine"], block["config"], results["versions"]
    start = block.get("start_accuracy")
    lines += [
        "",
        f"Setting `{setting}`: {c['steps']} optimizer steps x {c['completions_per_step']} completions "
        f"({c['prompts_per_step']} prompts x {c['group_size']}) per run, at most {c['max_new_tokens']} "
        f"new tokens; {m['cpus_used']} of {m['cpu_count']} cores ({m['cpu_model']}); trl {v.get('trl')}, "
        f"torch {v.get('torch')}, transformers {v.get('transformers')}; load average before the runs "
        f"{m['loadavg_before'][0]:.2f}" + (f"; held-out pass@1 before training {start:.3f}" if start is not None else "")
        + ".",
    ]
    return "\n".join(lines)


def plot_rewards(results: dict[str, Any], path: Path) -> None:
    """One PNG, a panel per setting: mean training reward per step against training seconds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["settings"])
    fig, axes = plt.subplots(1, len(names), figsize=(6.5 * len(names), 4.2), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        block = results["settings"][name]
        for r in block["runs"]:
            xs = [c["t"] for c in r["curve"]]
            ys = [c["reward"] for c in r["curve"]]
            ax.plot(xs, ys, marker=".", label=f"{r['label']} ({r['train_seconds']:.0f} s)")
        c = block["config"]
        ax.set_title(f"{name}: {c['steps']} GRPO steps x {c['completions_per_step']} completions")
        ax.set_xlabel("training wall-clock time (s)")
        ax.set_ylabel("mean training reward per step")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    fig.suptitle(f"cadence vs TRL on {results['machine']['cpus_used']} CPU cores")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(results: dict[str, Any], json_path: Path, png_path: Path, doc_path: Path) -> None:
    """JSON beside the plot, and each setting's table between its markers in `doc_path`."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=2))
    plot_rewards(results, png_path)
    doc_path.parent.mkdir(parents=True, exist_ok=True)
    for setting in results["settings"]:
        write_doc_table(doc_path, f"vs-trl-{setting}", markdown_table(results, setting))
