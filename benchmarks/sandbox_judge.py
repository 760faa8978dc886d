"""What a `reward.name=unit_tests` scoring costs, and where the time goes: two code trees side by side.

    python benchmarks/sandbox_judge.py --trees /tmp/base . --rounds 4 --n 10 --out docs/results/sandbox_judge.json

Each round runs every tree once, in turn, in a fresh process with that tree first on sys.path
(so the two share the machine's load), and each run scores one 4-test task `n` times with a
local sandbox, as the reward does (a fresh sandbox per response). Per scoring it times the
sandbox's cold start and the judge call apart, and, in the same sandbox, what the judge is made
of: an interpreter start-up inside (`python3 -I -S -c "import json"`: what the judge used to pay
per test) and a `code` call importing the judge's modules. Reported: p50 of each per tree, the
ratio of the last tree to the first, and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

TESTS = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0", "assert add('a', 'b') == 'ab'", "assert add(0, 0) == 0"]
SOLUTION = "def add(a, b):\n    return a + b\n"
PARTS = ("total", "start", "judge", "interpreter", "imports")


def inner(n: int) -> dict[str, list[float]]:
    """n scorings with the code on sys.path (the tree under test): milliseconds of each part."""
    from cadence.rewards.unit_tests import passed_tests
    from cadence.sandbox.models import Limits
    from cadence.sandbox.sandbox import LocalSandbox

    wall = 2.0 * len(TESTS) + 5.0  # what UnitTestReward.run gives a 4-test task
    out: dict[str, list[float]] = {part: [] for part in PARTS}
    for i in range(n + 1):  # the first is a warm-up (caches, the system view's mirror)
        t0 = time.perf_counter()
        with LocalSandbox(Limits(memory_mb=512, processes=64, wall_s=wall, cpu_s=wall)) as sb:
            t1 = time.perf_counter()
            assert passed_tests(sb, SOLUTION, TESTS, 2.0, wall) == len(TESTS)
            t2 = time.perf_counter()
            sb.exec(["python3", "-I", "-S", "-c", "import json"], timeout_s=10)
            t3 = time.perf_counter()
            sb.exec(code="import json, select, signal, socket, struct", timeout_s=10)
            t4 = time.perf_counter()
        if i:
            for part, ms in zip(PARTS, (t2 - t0, t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                out[part].append(ms * 1e3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trees", nargs="+", default=["."], help="checkouts to compare (the first is the baseline)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--n", type=int, default=10, help="scorings per tree per round")
    p.add_argument("--out", default=None)
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.inner:
        print(json.dumps(inner(a.n)))
        return
    trees = [os.path.abspath(t) for t in a.trees]
    times: dict[str, dict[str, list[float]]] = {t: {part: [] for part in PARTS} for t in trees}
    load_before = os.getloadavg()
    for r in range(a.rounds):
        for tree in trees:
            env = dict(os.environ, PYTHONPATH=tree)
            res = subprocess.run([sys.executable, os.path.abspath(__file__), "--inner", "--n", str(a.n)],
                                 cwd=tree, env=env, capture_output=True, text=True, check=True)
            for part, ms in json.loads(res.stdout.splitlines()[-1]).items():
                times[tree][part] += ms
            print(f"round {r + 1}/{a.rounds} {tree}: total p50 {statistics.median(times[tree]['total']):.1f} ms",
                  flush=True)
    load_after = os.getloadavg()
    p50 = {t: {part: round(statistics.median(v), 1) for part, v in times[t].items()} for t in trees}
    base, last = trees[0], trees[-1]
    report = {
        "what": "unit_tests scoring of a 4-test task, local sandbox; ms, p50 per tree (rounds alternate trees)",
        "trees": trees, "rounds": a.rounds, "n_per_round": a.n, "p50_ms": p50,
        "ratio_last_to_first": {part: round(p50[last][part] / p50[base][part], 3) for part in PARTS},
        "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in load_after],
    }
    print(json.dumps(report, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
