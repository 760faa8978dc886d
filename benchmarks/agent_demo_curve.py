"""The agent demo's learning curve: `cadence train --config examples/agents/calculator.yaml`, measured.

Runs the example's command as a user would (plus any overrides given here),
reads the run's own metrics.jsonl into docs/results/agent_demo.json and
docs/results/agent_demo.png (held-out success at every evaluation against
training seconds, the steps' `time/step` summed), measures the model before
and after with `scripts/make_calc_tiny.py --check` (the same agent on the
held-out problems: success and how often it calls the tool), writes the table
in docs/agents.md, and keeps the machine's load average, since the machine may
be shared.

    python benchmarks/agent_demo_curve.py [override ...]
    python benchmarks/agent_demo_curve.py --table      # only rewrite the docs table from the JSON
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness.py, frozenlake_curve.py beside this script
from frozenlake_curve import curve  # noqa: E402
from harness import plot_curve, run_example  # noqa: E402

from cadence.observe.report import write_doc_table  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "examples/agents/calculator.yaml"
OUT = ROOT / "docs" / "results" / "agent_demo.json"
DOC = ROOT / "docs" / "agents.md"


def check(model: str) -> dict:
    """Held-out success and tool-call rate of `model` with the example agent (100 problems x 4 runs, T=1)."""
    out = subprocess.run([sys.executable, "scripts/make_calc_tiny.py", "--check", model], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return {k: float(v) if "." in v else int(v) for k, v in (item.split("=") for item in out.split())}


def plot(points: list[dict], path: Path) -> None:
    plot_curve(points, path, "calculator agent (plain openai SDK) on builtin:calc",
               "held-out success (agent samples at T=1)")


def table(result: dict) -> str:
    """The docs table: held-out success at each evaluation, then the check of the model before and after."""
    steps = [p["step"] for p in result["curve"]]
    head = " | ".join("before" if s == 0 else f"step {s}" for s in steps)
    success = " | ".join(f"{p['held_out_success']:.2f}" for p in result["curve"])
    rows = [f"| held-out success: {head} | training seconds | command seconds | load average before / after |",
            "|" + "---|" * (len(steps) + 3),
            f"| {success} | {result['train_seconds']:.0f} | {result['command_wall_seconds']:.0f} | "
            f"{result['loadavg_before'][0]:.1f} / {result['loadavg_after'][0]:.1f} |",
            "",
            "| model | success | calls the tool | success when it calls | success when it guesses |",
            "|---|---|---|---|---|"]
    for name, check_ in (("builtin:calc (before)", result["check_before"]), ("after RL", result["check_after"])):
        rows.append(f"| {name} | {check_['success']:.2f} | {check_['tool_call_rate']:.2f} | "
                    f"{check_['success_with_tool']:.2f} | {check_['success_without_tool']:.2f} |")
    return "\n".join(rows)


def main(overrides: list[str]) -> None:
    run = run_example(CONFIG, overrides, "agent-demo-curve")
    records = run.records
    points = curve(records)
    before, after = points[0]["held_out_success"], points[-1]["held_out_success"]
    config = yaml.safe_load((ROOT / CONFIG).read_text())
    last = max((run.run_dir / "checkpoints").glob("step_*"), key=lambda d: int(d.name.split("_")[1]))
    result = {
        "command": run.command,
        "config": config,
        "held_out_problems": config["task"]["test_size"],
        "eval_samples_per_problem": config["eval"]["samples"],
        "before": before,
        "after": after,
        "change_points": round(100 * (after - before), 1),
        "train_seconds": points[-1]["train_seconds"],
        "command_wall_seconds": round(run.wall_s, 1),
        "curve": points,
        "reward_mean_per_step": [[r["step"], round(r["reward/mean"], 4)] for r in records
                                 if r["step"] > 0 and "reward/mean" in r],
        "check_before": check(config["model"]["path"]),
        "check_after": check(str(last)),
        **run.where_and_when(),
    }
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    plot(points, OUT.with_suffix(".png"))
    write_doc_table(DOC, "agent-demo", table(result))
    print(f"held-out success {before:.3f} -> {after:.3f} ({result['change_points']:+.1f} points) in "
          f"{result['train_seconds']:.0f} s of training, {run.wall_s:.0f} s for the command; wrote {OUT}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--table"]:
        write_doc_table(DOC, "agent-demo", table(json.loads(OUT.read_text())))
    else:
        main(sys.argv[1:])
