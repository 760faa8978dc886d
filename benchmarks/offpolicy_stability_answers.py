"""What a stale-trained policy answers: one cell of the off-policy grid, then its greedy answers minus the truth.

    python benchmarks/offpolicy_stability_answers.py --loss "grpo, no correction" --alpha 8 --steps 10
    python benchmarks/offpolicy_stability_answers.py --loss topr --alpha 8 --steps 10

Trains like benchmarks/offpolicy_stability.py (same setting, seed 0) for
`--steps` steps, keeps the final checkpoint, and counts its greedy answers on
the 300 held-out carrying additions by (answer - correct sum): 0 is right, -10
is the warm-up's slip (the forgotten carry), anything else is a new mistake.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import offpolicy_stability as grid  # noqa: E402
from harness import train_run  # noqa: E402


def answer_offsets(checkpoint: Path, test_file: Path) -> collections.Counter:
    """Counter of greedy answer minus the correct sum over the test problems ('unparsable' if not a number)."""
    from transformers import AutoModelForCausalLM

    from cadence.models.loading import load_tokenizer

    tests = [json.loads(line) for line in test_file.read_text().splitlines()]
    tokenizer, model = load_tokenizer(str(checkpoint)), AutoModelForCausalLM.from_pretrained(str(checkpoint)).eval()
    # Every prompt is "ab+cd=", the same length, so one batch needs no padding.
    ids = tokenizer([t["prompt"] for t in tests], return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=8, do_sample=False)
    offsets: collections.Counter = collections.Counter()
    for test, row in zip(tests, out, strict=True):
        text = tokenizer.decode(row[ids.shape[1]:], skip_special_tokens=True).split("\n")[0].strip()
        offsets[int(text) - int(test["answer"]) if text.lstrip("-").isdigit() else "unparsable"] += 1
    return offsets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loss", default="grpo, no correction", choices=list(grid.LOSSES))
    ap.add_argument("--alpha", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    data = grid.DATA
    grid.write_carry_task(data)
    setting = {**grid.SETTING, "steps": args.steps, "eval_every": args.steps}
    with tempfile.TemporaryDirectory() as run_dir:
        run = train_run(grid.overrides(grid.LOSSES[args.loss], args.alpha, args.seed, setting, data), run_dir)
        checkpoint = max((Path(run_dir) / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
        offsets = answer_offsets(checkpoint, data / "test.jsonl")
    print(
        f"{args.loss}, alpha={args.alpha}, seed {args.seed}, {args.steps} steps: held-out pass@1 "
        f"{run.summary.eval_after.pass_at_1:.3f}; answer - correct sum: {dict(offsets.most_common())}"
    )


if __name__ == "__main__":
    main()
