"""The report of benchmarks/rhythm_credit.py: the markdown tables of docs/attention_rhythm.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cadence.observe.report import write_doc_table

TABLE_START, TABLE_END = "<!-- rhythm-table-start -->", "<!-- rhythm-table-end -->"




def percent(x: float) -> str:
    return f"{100 * x:.1f}"


def or_dash(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def _warmup_note(meta: dict[str, Any]) -> str:
    info = meta["settings"].get("scratchpad")
    if not info:
        return ""
    if info["sft_cached"]:
        return f"; scratchpad warm-up reused, it took {info['sft_seconds']:.0f} s when made"
    return f"; including the {info['sft_seconds']:.0f} s scratchpad warm-up"


def markdown_table(summary: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The results table (one per setting) and what reproduces it."""
    lines = [
        f"Measured {meta['date']} on {meta['machine']}, torch threads 1, "
        f"{meta['steps']} steps, seeds {' '.join(map(str, meta['seeds']))}; "
        f"benchmark wall time {meta['wall_s'] / 60:.1f} min (1-minute load average up to "
        f"{meta['load_avg_max']:.1f} on the shared machine{_warmup_note(meta)}). Reproduce with "
        f"`{meta['command']}`; every run is in `docs/results/rhythm_credit.json`.",
        "",
    ]
    for setting in dict.fromkeys(row["setting"] for row in summary):
        rows = [row for row in summary if row["setting"] == setting]
        info = meta["settings"][setting]
        lines += [
            f"**{setting}**: {info['what']}; mean response {rows[0]['response_len']:.1f} tokens, "
            f"{info['batch']} samples a step.",
            "",
            "| method | pass@1 before | pass@1 after (mean ± sd) | per seed | step s | "
            "attention s | attention share of step | step time vs GRPO | amplified tokens | mean gamma |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in rows:
            same = " (identical to GRPO)" if row["identical_to_grpo"] else ""
            lines.append(
                f"| {row['label']}{same} | {row['pass_before']:.3f} | "
                f"{row['pass_after_mean']:.3f} ± {row['pass_after_sd']:.3f} | "
                f"{' / '.join(f'{x:.3f}' for x in row['pass_after'])} | {row['step_s']:.3f} | "
                f"{row['attention_s']:.3f} | {percent(row['attention_share'])}% | "
                f"{or_dash(row['step_vs_grpo'], '.2f')}x | "
                f"{'–' if row['amplified_frac'] is None else percent(row['amplified_frac']) + '%'} | "
                f"{or_dash(row['gamma_mean'], '.3f')} |"
            )
        lines.append("")
    carry = meta.get("carry_credit")
    if carry:
        lines += [
            f"Scratchpad, the deciding token (the tens column's carry digit, position "
            f"{carry['carry_position_mean']:.0f} of ~{carry['response_len_mean']:.0f}) in "
            f"{carry['responses']} right and slipped workings of carrying test problems, read by "
            f"the warmed-up model:",
            "",
            "| credit | carry digit amplified | its mean gamma |",
            "|---|---|---|",
            *(
                f"| {c} | {percent(carry[c]['carry_amplified'])}% | {carry[c]['carry_gamma_mean']:.3f} |"
                for c in ("local", "global", "coupled")
            ),
            "",
            f"Median FAI of the selected anchors: {carry['anchor_fai_median']:.1e}; "
            f"{percent(carry['anchor_fai_below_1e-4'])}% of them have FAI < 1e-4.",
            "",
        ]
    probes = meta.get("attention_probe", {})
    if probes:
        lines += [
            "Where the attention pass's time goes (one synthetic batch of distinct rows, best of 3; "
            "the trainer's micro-batch is `algorithm.rhythm.micro_batch`, 128 by default): the eager "
            "forward of the copy vs the credit math batched over samples (head spans, WAAD, FAI, top-q).",
            "",
            "| setting | layers read | micro-batch | pass s | forward s | credit math s |",
            "|---|---|---|---|---|---|",
        ]
        for setting, rows in probes.items():
            for row in rows:
                lines.append(
                    f"| {setting} ({row['batch']} x {row['response_len']} tokens) | "
                    f"{row['layers_read']} | {row['micro_batch']} | {row['total_s']:.3f} | "
                    f"{row['forward_s']:.3f} | {row['credit_math_s']:.3f} |"
                )
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write_table(doc: Path, table: str) -> None:
    """Replace what lies between the `rhythm` markers of `doc` (appended when missing)."""
    write_doc_table(doc, "rhythm", table.rstrip("\n"))
