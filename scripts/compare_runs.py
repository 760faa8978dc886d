"""Are two training runs the same run? Every non-timing metric of every step, and the final weights.

    python scripts/compare_runs.py runs/before runs/after

For a refactor that must leave synchronous training bit-identical: train the
same config with the old and the new code (e.g. the old one from a
`git worktree`, run as `python -m cadence train ...` inside it), then compare.
Exits 1 on any difference. Held-out evaluations are compared where both runs
have them (a run may evaluate more often: evaluation must not change training).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

TIMING = ("time/", "_per_s", "seconds", "busy", "wall", "elapsed", "_s")


def steps(run: Path) -> dict[int, dict]:
    merged: dict[int, dict] = {}  # a step's training row and its evaluation row, as one
    for line in (run / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            merged.setdefault(row["step"], {}).update(row)
    return merged


def final_weights(run: Path) -> tuple[int, dict[str, torch.Tensor]]:
    last = max(int(p.name.removeprefix("step_")) for p in (run / "checkpoints").glob("step_*"))
    return last, load_file(next((run / "checkpoints" / f"step_{last}").glob("*.safetensors")))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    args = ap.parse_args()
    a, b = steps(args.a), steps(args.b)
    differences = []
    for step in sorted(a.keys() | b.keys()):
        if step not in a or step not in b:
            differences.append(f"step {step} is in one run only")
            continue
        for key in a[step].keys() & b[step].keys():
            if not any(t in key for t in TIMING) and a[step][key] != b[step][key]:
                differences.append(f"step {step} {key}: {a[step][key]} != {b[step][key]}")
    (last_a, wa), (last_b, wb) = final_weights(args.a), final_weights(args.b)
    same_weights = last_a == last_b and wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    if not same_weights:
        differences.append(f"final weights differ (step {last_a} vs step {last_b})")
    print(f"{len(a)} and {len(b)} logged steps; final checkpoints step {last_a} and {last_b}")
    print("\n".join(differences[:20]) or "identical: every non-timing metric of every step, and the final weights")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
