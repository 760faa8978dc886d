"""End-of-run artefacts people look at: a reward-curve PNG and a summary table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def curve_series(
    records: list[dict[str, Any]], keys: tuple[str, ...] = ("reward/mean", "reward/accuracy")
) -> list[tuple[str, list[int], list[float]]]:
    """(label, steps, values) of each training curve; keys with identical values share one
    line named after all of them (binary rewards: accuracy is the mean reward)."""
    series = {key: [(r["step"], r[key]) for r in records if key in r] for key in keys}
    out, drawn = [], set()
    for key in keys:
        points = series[key]
        if not points or key in drawn:
            continue
        same = [k for k in keys if k != key and series[k] == points]
        drawn.update(same)
        steps, values = zip(*points, strict=True)
        out.append((" = ".join([key, *same]), list(steps), list(values)))
    return out


def held_out_label(episodes: bool) -> str:
    """What held-out evaluation measures, as the docs name it: episodes solved, or answers right."""
    return "held-out success" if episodes else "held-out pass@1"


def plot_curves(records: list[dict[str, Any]], path: Path, keys: tuple[str, ...] = ("reward/mean", "reward/accuracy"),
                held_out_name: str = "held-out pass@1") -> Path:
    """Training reward and accuracy against step (raw and moving average), and held-out
    pass@1 (`eval/pass@1`: before training at step 0, every `eval.every` steps, after),
    labelled `held_out_name`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for label, steps, values in curve_series(records, keys):
        line = ax.plot(steps, values, alpha=0.3, linewidth=1)[0]
        window = max(1, len(values) // 20)
        smooth = [sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]
        ax.plot(steps, smooth, linewidth=2, color=line.get_color(), label=f"{label} (training batch, moving avg {window})")
    held_out = [(r["step"], r["eval/pass@1"]) for r in records if "eval/pass@1" in r]
    if held_out:
        steps, values = zip(*held_out, strict=True)
        ax.plot(steps, values, "o-", color="black", linewidth=1.5, markersize=4, label=held_out_name)
    ax.set_xlabel("training step")
    ax.set_ylabel("reward / accuracy")
    ax.set_title("cadence: reward and accuracy during training")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def summary_table(rows: list[tuple[str, str]], title: str = "run summary") -> Table:
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in rows:
        table.add_row(k, v)
    return table


def print_summary(rows: list[tuple[str, str]], title: str = "run summary") -> None:
    Console().print(summary_table(rows, title))


def write_doc_table(doc: Path, name: str, table: str) -> None:
    """Put `table` between `<!-- {name}-table-start -->` and `-end -->` in a markdown file.

    Benchmarks write their tables into the docs this way: a rerun replaces the
    old table and leaves the prose around it alone. Missing markers (or file)
    are appended at the end.
    """
    start, end = f"<!-- {name}-table-start -->", f"<!-- {name}-table-end -->"
    text = doc.read_text() if doc.exists() else ""
    if start not in text or end not in text:
        text += f"\n{start}\n{end}\n"
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    doc.write_text(f"{head}{start}\n{table}\n{end}{tail}")
