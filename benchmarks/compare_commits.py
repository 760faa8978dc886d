"""One benchmark, two versions of cadence, side by side in one run: is a change a regression?

    python benchmarks/compare_commits.py --before d5543f8 --rounds 2 \\
        --out docs/results/refactor_throughput.json -- \\
        python {after}/benchmarks/async_throughput.py --no-generation-table \\
        --only "sync (inline, 2 threads)" "async alpha=2"

The command runs in a git worktree of `--before` and in this checkout, in
alternating rounds (before, after, after, before, ...) so that a machine that
gets busier or quieter over the run weighs on both alike. Each run's working
directory is its own tree, so `python benchmarks/x.py` and `import cadence`
both resolve to that tree's code; `{after}` in the command is this checkout,
to run today's benchmark script against both versions of the package. Every JSON object the command prints on a
line of its own with a "variant" and a `--metric` (default samples_per_s) is a
measurement; the table gives each variant's median per version and the ratio
after / before.
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
    """Run `cmd` in `tree`; the metric of every variant it reported."""
    env = {**os.environ, "PYTHONPATH": str(tree)}  # the tree's cadence, not the installed one
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed in {tree}:\n{out.stderr[-3000:]}")
    found = {}
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            if isinstance(row, dict) and "variant" in row and metric in row:
                found[row["variant"]] = float(row[metric])
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the commit to compare against (e.g. the one before a change)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each version, alternating")
    ap.add_argument("--metric", default="samples_per_s", help="the number each row reports (higher is better)")
    ap.add_argument("--out", type=Path, default=None, help="write the results JSON here")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- the benchmark command")
    args = ap.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    cmd = [part.replace("{after}", str(ROOT)) for part in cmd]
    if not cmd:
        ap.error("give the benchmark command after --")
    after = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(old), args.before], cwd=ROOT, check=True)
        try:
            order = [("before", old), ("after", ROOT)]
            for r in range(args.rounds):
                for name, tree in order if r % 2 == 0 else order[::-1]:
                    runs[name].append(measure(cmd, tree, args.metric))
                    print(f"round {r + 1}: {name}: {json.dumps(runs[name][-1])}", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, check=False)
    table = []
    for variant in runs["after"][0]:
        b = statistics.median(run[variant] for run in runs["before"])
        a = statistics.median(run[variant] for run in runs["after"])
        table.append({"variant": variant, f"before_{args.metric}": b, f"after_{args.metric}": a, "ratio": a / b})
        print(f"{variant}: before {b:.2f}  after {a:.2f}  after/before {a / b:.3f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "command": shlex.join(["python", "benchmarks/compare_commits.py", *sys.argv[1:]]),
            "before": args.before, "after": after, "load_average": os.getloadavg(),
            "table": table, "runs": runs,
        }, indent=2))


if __name__ == "__main__":
    main()
