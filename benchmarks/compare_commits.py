"""One benchmark, two versions of cadence, side by side in one run: is a change a regression?

    python benchmarks/compare_commits.py --before d5543f8 --rounds 2 \\
        --out docs/results/refactor_throughput.json -- \\
        python {after}/benchmarks/async_throughput.py --no-generation-table \\
        --only "sync (inline, 2 threads)" "async alpha=2"

The command runs in a git worktree of `--before` and in this checkout (or in a
worktree of `--after`, so that edits made meanwhile do not leak into the
runs), in alternating rounds (before, after, after, before, ...) so that a
machine that gets busier or quieter over the run weighs on both alike. Each
run's working directory is its own tree, so `python benchmarks/x.py` and
`import cadence` both resolve to that tree's code; `{after}` in the command is
the after tree, to run its benchmark script against both versions of the
package, and `{run}` a folder per run under `--keep`. Every JSON object the
command prints on a line of its own with a "variant" and a `--metric`
(default samples_per_s) is a measurement; the table gives each variant's
median per version, the ratio of the medians, and the median and quartiles
of the paired ratios (after / before within a round, which cancels most of a
shared machine's drift). A row naming the `cadence` its processes imported
from outside their tree stops the comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(cmd: list[str], tree: Path, metric: str) -> dict[str, float]:
    """Run `cmd` in `tree`; the metric of every variant it reported, and the load average before it."""
    env = {**os.environ, "PYTHONPATH": str(tree)}  # the tree's cadence, not the installed one
    load = os.getloadavg()[0]
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed in {tree}:\n{out.stderr[-3000:]}")
    found = {"loadavg_1min": load}
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            if isinstance(row, dict) and "variant" in row and metric in row:
                found[row["variant"]] = float(row[metric])
                for key in ("cadence", "ray_worker_cadence"):  # which tree each process imported
                    if row.get(key) and not row[key].startswith(str(tree)):
                        sys.exit(f"{row['variant']} in {tree} imported {key} from {row[key]}: set PYTHONPATH right")
    return found


def paired_ratios(runs: dict[str, list[dict[str, float]]], variant: str) -> list[float]:
    """after / before of each round: the two runs of a round ran back to back, under about the same load."""
    return [a[variant] / b[variant] for b, a in zip(runs["before"], runs["after"], strict=True)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the commit to compare against (e.g. the one before a change)")
    ap.add_argument("--after", default=None,
                    help="a commit to run in a worktree of its own (default: this checkout as it is)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each version, alternating")
    ap.add_argument("--metric", default="samples_per_s", help="the number each row reports (higher is better)")
    ap.add_argument("--out", type=Path, default=None, help="write the results JSON here")
    ap.add_argument("--keep", type=Path, default=None,
                    help="{run} in the command becomes <keep>/<round>_<before|after>, a folder per run")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- the benchmark command")
    args = ap.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("give the benchmark command after --")
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"before": Path(tmp) / "before", "after": Path(tmp) / "after" if args.after else ROOT}
        for name, commit in (("before", args.before), ("after", args.after)):
            if commit:
                subprocess.run(["git", "worktree", "add", "--detach", "-q", str(trees[name]), commit], cwd=ROOT, check=True)
        commits = {name: subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True,
                                        text=True).stdout.strip() for name, tree in trees.items()}
        cmd = [part.replace("{after}", str(trees["after"])) for part in cmd]
        try:
            order = ["before", "after"]
            for r in range(args.rounds):
                for name in order if r % 2 == 0 else order[::-1]:
                    run_dir = str(args.keep.resolve() / f"{r + 1:02d}_{name}") if args.keep else ""
                    runs[name].append(measure([part.replace("{run}", run_dir) for part in cmd], trees[name], args.metric))
                    print(f"round {r + 1}: {name}: {json.dumps(runs[name][-1])}", flush=True)
        finally:
            for name, commit in (("before", args.before), ("after", args.after)):
                if commit:
                    subprocess.run(["git", "worktree", "remove", "--force", str(trees[name])], cwd=ROOT, check=False)
    table = []
    for variant in (v for v in runs["after"][0] if v != "loadavg_1min"):
        b = statistics.median(run[variant] for run in runs["before"])
        a = statistics.median(run[variant] for run in runs["after"])
        ratios = sorted(paired_ratios(runs, variant))
        q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
        table.append({"variant": variant, f"before_{args.metric}": b, f"after_{args.metric}": a, "ratio": a / b,
                      "paired_ratios": ratios, "median_paired_ratio": statistics.median(ratios),
                      "paired_ratio_quartiles": [q1, q3], "rounds_after_faster": sum(x > 1 for x in ratios)})
        print(f"{variant}: before {b:.2f}  after {a:.2f}  after/before {a / b:.3f}; paired ratios: median "
              f"{statistics.median(ratios):.3f}, quartiles {q1:.3f}-{q3:.3f}, range {ratios[0]:.3f}-{ratios[-1]:.3f}, "
              f"after faster in {sum(x > 1 for x in ratios)} of {len(ratios)}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "command": shlex.join(["python", "benchmarks/compare_commits.py", *sys.argv[1:]]),
            "before": commits["before"], "after": commits["after"], "load_average": os.getloadavg(),
            "table": table, "runs": runs,
        }, indent=2))


if __name__ == "__main__":
    main()
