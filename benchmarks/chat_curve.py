"""The chat model's learning curve: `cadence train --config examples/chat_arith.yaml`, measured.

Runs the example's command as a user would (plus any overrides given here), reads the run's
own metrics.jsonl into docs/results/chat_arith.json and docs/results/chat_arith.png (held-out
pass@1 at every evaluation against training seconds, the steps' `time/step` summed), evaluates
the starting model on the same held-out prompts sent as raw text (`task.chat_template=off`,
what RLVR sent a chat model before prompts went through the template), writes the table in
docs/chat_templates.md, and keeps the machine's load average, since the machine may be shared.

    python benchmarks/chat_curve.py [override ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness.py, frozenlake_curve.py beside this script
from frozenlake_curve import curve  # noqa: E402
from harness import plot_curve, run_example  # noqa: E402

from cadence.observe.report import write_doc_table  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "examples/chat_arith.yaml"


def table(result: dict) -> str:
    steps = [p["step"] for p in result["curve"]]
    head = " | ".join("before" if s == 0 else f"step {s}" for s in steps)
    scores = " | ".join(f"{p['held_out_success']:.3f}" for p in result["curve"])
    return "\n".join([
        f"| held-out pass@1: {head} | raw text (before) | training seconds | command seconds | load average before / after |",
        "|" + "---|" * (len(steps) + 4),
        f"| {scores} | {result['raw_text_pass_at_1']:.3f} | {result['train_seconds']:.0f} | "
        f"{result['command_wall_seconds']:.0f} | {result['loadavg_before'][0]:.1f} / {result['loadavg_after'][0]:.1f} |",
    ])


def main(overrides: list[str]) -> None:
    from cadence.config import load_config
    from cadence.recipes.evaluate import run_eval

    raw_text = run_eval(load_config(ROOT / CONFIG, [*overrides, "task.chat_template=off"])).pass_at_1
    run = run_example(CONFIG, overrides, "chat-arith-curve")
    points = curve(run.records)
    before, after = points[0]["held_out_success"], points[-1]["held_out_success"]
    result = {
        "command": run.command,
        "before": before,
        "after": after,
        "change_points": round(100 * (after - before), 1),
        "raw_text_pass_at_1": raw_text,
        "train_seconds": points[-1]["train_seconds"],
        "command_wall_seconds": round(run.wall_s, 1),
        "curve": points,
        **run.where_and_when(),
    }
    out = ROOT / "docs/results/chat_arith.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot_curve(points, out.with_suffix(".png"), "RLVR on builtin:arith-chat through its chat template",
               "held-out pass@1, prompts through the template", ylabel="pass@1 (greedy)",
               baseline=(raw_text, "the start, prompts as raw text"))
    write_doc_table(ROOT / "docs/chat_templates.md", "chat-arith", table(result))
    print(f"held-out pass@1 {before:.3f} -> {after:.3f} ({result['change_points']:+.1f} points) in "
          f"{result['train_seconds']:.0f} s of training, {run.wall_s:.0f} s for the command "
          f"(raw text: {raw_text:.3f}); wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
