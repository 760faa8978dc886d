"""Off-policy stability: held-out accuracy as samples grow stale, per policy loss (ROLL Flash's experiment).

    python benchmarks/offpolicy_stability.py             # the documented grid (~2.5 h on 2 cores)
    python benchmarks/offpolicy_stability.py --quick     # smoke run, writes only --out (a temp file)

The setting ("carry"): the built-in model (cadence/assets/arith-tiny) on the
2-digit additions that carry the one, the problems its warm-up taught it to get
wrong (greedy held-out pass@1 about 0.21; the full `arith` task starts at 0.66
and saturates at 0.995, which cannot separate algorithms). The prompts are
JSONL files this script writes (every carrying problem, 300 held out as test).
The learning rate (3e-4, three times `cadence train`'s) moves the policy a lot
per step, so a batch generated alpha versions ago is visibly off-policy.

Grid: rollout.async_ratio alpha in {0, 1, 2, 4, 8, 16} (inline runtime:
generation runs in a background thread up to alpha policy versions ahead of
training) x loss (`LOSSES`, the default grid; `EXTRA_LOSSES` by --losses):

  grpo, no correction    algorithm.loss=grpo algorithm.mismatch.mode=none
  grpo (default)         algorithm.loss=grpo: cadence's default behaviour weight,
                         truncated pi_old/mu (algorithm.mismatch.mode=auto)
  topr, decoupled_ppo    algorithm.loss=<name>: importance weights against mu,
                         the engine's behaviour log-probs (tis, cispo: extra)
  grpo + icepop/seq_mis/ algorithm.mismatch.mode=<name>: the high-staleness
  geo_rs/m2po            corrections of cadence/algo/offpolicy.py
  topr + token mask      topr with tokens whose pi_old/mu is outside [0.5, 2] dropped
  asyppo, no correction  algorithm.name=asyppo algorithm.mismatch.mode=none
                         (the paper's PPO: only its two mini-critics)
  asyppo + pi_old/mu     algorithm.name=asyppo with the default token weight
  asyppo + topr +        algorithm.name=asyppo algorithm.loss=topr
  whitening              algorithm.whiten_advantages=true (the best combination found)

x 3 seeds. Held-out greedy pass@1 every 10 steps (eval.every); per run also the
mean of the per-step offpolicy/* metrics (ESS, masked share, KL(mu || pi_old))
and samples/s. Results go to docs/results/offpolicy_stability.json and .png
and the tables between the offpolicy markers of docs/async.md
(benchmarks/offpolicy_stability_report.py).

Budget: 12 losses x 6 alphas x 3 seeds = 216 runs of 60 steps, 2 at a time
with one torch thread each: about 13 s a run on a quiet machine (216 x 13 s / 2
= 25 min), 60-80 s at load 15-20 (the 2026-11-27 grid, beside other work: about
2.5 h). A killed grid resumes (the .partial.jsonl file). To stay under 3 h on a
busy machine, drop seeds or alphas (--seeds, --alphas), never steps.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any

# The shared benchmark harness lives beside this script (benchmarks/ is not a package).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import cpu_model, train_run  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results" / "offpolicy_stability.json"
DATA = ROOT / "runs" / "offpolicy-carry"
ALPHAS = (0, 1, 2, 4, 8, 16)
FIRST_ALPHAS = (0, 8, 16)
LOSSES: dict[str, list[str]] = {
    "grpo, no correction": ["algorithm.loss=grpo", "algorithm.mismatch.mode=none"],
    "grpo (default: pi_old/mu weight)": ["algorithm.loss=grpo"],
    "topr": ["algorithm.loss=topr"],
    "decoupled_ppo": ["algorithm.loss=decoupled_ppo"],
    "grpo + icepop": ["algorithm.loss=grpo", "algorithm.mismatch.mode=icepop"],
    "grpo + seq_mis": ["algorithm.loss=grpo", "algorithm.mismatch.mode=seq_mis"],
    "grpo + geo_rs": ["algorithm.loss=grpo", "algorithm.mismatch.mode=geo_rs"],
    "grpo + m2po": ["algorithm.loss=grpo", "algorithm.mismatch.mode=m2po"],
    "topr + token mask": ["algorithm.loss=topr", "algorithm.mismatch.mode=mask"],
    "asyppo, no correction": ["algorithm.name=asyppo", "algorithm.mismatch.mode=none"],
    "asyppo + pi_old/mu weight": ["algorithm.name=asyppo"],
    # The best combination found for the critics (docs/asyppo.md#asyppo-off-policy).
    "asyppo + topr + whitening": ["algorithm.name=asyppo", "algorithm.loss=topr", "algorithm.whiten_advantages=true"],
}
# Measured on 2026-11-23 (docs/async.md), left out of the default grid to fit its budget.
EXTRA_LOSSES: dict[str, list[str]] = {
    "tis": ["algorithm.loss=tis"],
    "cispo": ["algorithm.loss=cispo"],
}
ALL_LOSSES = {**LOSSES, **EXTRA_LOSSES}
# Per-step metrics kept as their mean over a run's steps (cadence/algo/offpolicy_metrics.py).
OFFPOLICY_METRICS = ("offpolicy/ess", "offpolicy/ess_seq", "offpolicy/masked_frac", "offpolicy/kl_mu_pi_old")
SETTING = {"lr": 3e-4, "prompts_per_step": 8, "group_size": 8, "steps": 60, "eval_every": 10, "test_size": 300}
QUICK = {"lr": 3e-4, "prompts_per_step": 4, "group_size": 4, "steps": 2, "eval_every": 1, "test_size": 16}
TEST_PROBLEMS = 300


def carries(a: int, b: int) -> bool:
    """Whether a+b carries out of the units column: exactly the problems the warm-up slips on."""
    return a % 10 + b % 10 >= 10


def write_carry_task(folder: Path) -> tuple[Path, Path]:
    """Every 2-digit carrying addition as JSONL (arith's prompt format); a fixed 300 go to test.

    Deterministic, so a rerun rewrites the same files. The warm-up saw most of these
    problems (with the slipped answers); RL never trains on the test ones.
    """
    problems = [(a, b) for a in range(100) for b in range(100) if carries(a, b)]
    random.Random(0).shuffle(problems)
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "train.jsonl", folder / "test.jsonl"
    for path, part in zip(paths, (problems[TEST_PROBLEMS:], problems[:TEST_PROBLEMS]), strict=True):
        lines = [json.dumps({"prompt": f"{a:02d}+{b:02d}=", "answer": str(a + b)}) for a, b in part]
        path.write_text("\n".join(lines) + "\n")
    return paths


def overrides(algo: list[str], alpha: int, seed: int, setting: dict[str, Any], data: Path) -> list[str]:
    """The `cadence train` config of one cell of the grid; `algo` is the loss's overrides."""
    train, test = data / "train.jsonl", data / "test.jsonl"
    return [
        "task.name=jsonl", f"task.train_file={train}", f"task.test_file={test}",
        f"task.test_size={setting['test_size']}",
        # arith's conventions: the answer is the first line, and a newline ends it.
        "reward.extract=first_line", 'rollout.stop=["\\n"]',
        f"rollout.prompts_per_step={setting['prompts_per_step']}", f"rollout.group_size={setting['group_size']}",
        f"trainer.lr={setting['lr']}", f"trainer.steps={setting['steps']}", f"eval.every={setting['eval_every']}",
        f"rollout.async_ratio={alpha}", "runtime.kind=inline", "runtime.threads=1", f"seed={seed}",
        "logging.progress=false", "logging.tensorboard=false", "checkpoint.every=0",
        *algo,
    ]


def run_cell(
    loss: str, algo: list[str], alpha: int, seed: int, setting: dict[str, Any], data: Path
) -> dict[str, Any]:
    """Train one cell; keep its held-out curve, staleness, training reward and clocks."""
    import torch

    torch.set_num_threads(1)
    run = train_run(overrides(algo, alpha, seed, setting, data))
    steps = [r for r in run.records if "reward/mean" in r]
    # The harness keeps training steps only; step 0 of the curve is the evaluation before training.
    before = run.summary.eval_before.pass_at_1
    curve = [[0, before]] + [[r["step"], r["eval/pass@1"]] for r in run.records if "eval/pass@1" in r and r["step"] > 0]
    tail = steps[-max(1, len(steps) // 5):]
    samples = steps[-1]["progress/samples_total"]
    return {
        "loss": loss,
        "alpha": alpha,
        "seed": seed,
        "curve": curve,  # [step, held-out pass@1], step 0 = before training
        "before": before,
        "after": run.summary.eval_after.pass_at_1,
        "best": max(p for _, p in curve),
        "staleness_mean": statistics.mean(r["train/staleness_mean"] for r in steps),
        "staleness_max": max(r.get("train/staleness_max", r["train/staleness_mean"]) for r in steps),
        "reward_last": statistics.mean(r["reward/mean"] for r in tail),
        "train_seconds": run.summary.seconds,
        "wall_s": run.wall_s,
        # Trained samples per second of step time (evaluations excluded; generation and training
        # overlap at alpha > 0, which is the speed staleness buys).
        "samples_per_s": samples / sum(r["time/step"] for r in steps),
        **{name: statistics.mean(r.get(name, float("nan")) for r in steps) for name in OFFPOLICY_METRICS},
        "ess_min": min(r.get("offpolicy/ess", float("nan")) for r in steps),
    }


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (loss, alpha): final pass@1 mean +- sd over seeds, the mean curve, staleness, time."""
    rows = []
    order = [*ALL_LOSSES, *(r["loss"] for r in runs)]  # the grid's order; a loss added by hand goes last
    for loss in sorted({r["loss"] for r in runs}, key=order.index):
        for alpha in sorted({r["alpha"] for r in runs}):
            mine = sorted((r for r in runs if r["loss"] == loss and r["alpha"] == alpha), key=lambda r: r["seed"])
            if not mine:
                continue
            after = [r["after"] for r in mine]
            steps = [s for s, _ in mine[0]["curve"]]
            rows.append({
                "loss": loss,
                "alpha": alpha,
                "seeds": [r["seed"] for r in mine],
                "before": statistics.mean(r["before"] for r in mine),
                "after_mean": statistics.mean(after),
                "after_sd": statistics.stdev(after) if len(after) > 1 else 0.0,
                "per_seed": after,
                "best_mean": statistics.mean(r["best"] for r in mine),
                "curve_steps": steps,
                "curve_mean": [statistics.mean(r["curve"][i][1] for r in mine) for i in range(len(steps))],
                "staleness_mean": statistics.mean(r["staleness_mean"] for r in mine),
                "reward_last": statistics.mean(r["reward_last"] for r in mine),
                "wall_s": statistics.mean(r["wall_s"] for r in mine),
                # Runs from before the offpolicy metrics existed have none: NaN, shown as "–".
                **{key: statistics.mean(r.get(key, float("nan")) for r in mine)
                   for key in ("samples_per_s", "ess_min", *OFFPOLICY_METRICS)},
            })
    return rows


def run_grid(
    cells: list[tuple[str, list[str], int, int]], setting: dict[str, Any], data: Path, jobs: int,
    partial: Path | None = None,
) -> list[dict]:
    """Every cell, `jobs` at a time in spawned processes (1: in this process).

    Each finished run is appended to `partial` (JSONL) as it ends, and runs found there with
    the same setting are not run again: a grid of hours that is killed resumes where it was.
    """
    done = _finished_runs(partial, setting)
    runs = [done[key] for key in map(_cell_key, cells) if key in done]
    todo = [cell for cell in cells if _cell_key(cell) not in done]
    if runs:
        print(f"{len(runs)} runs already in {partial}; {len(todo)} to go", flush=True)

    def keep(run: dict[str, Any]) -> dict[str, Any]:
        if partial is not None:
            with partial.open("a") as f:
                f.write(json.dumps({"setting": setting, "run": run}) + "\n")
        runs.append(_report(run))
        return run

    if jobs == 1:
        for cell in todo:
            keep(run_cell(*cell, setting, data))
        return runs
    with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(run_cell, *cell, setting, data) for cell in todo]
        for future in as_completed(futures):
            keep(future.result())
    return runs


def _partial_result(out: Path) -> dict[str, Any]:
    """The documented grid's results from its resume file: the runs finished so far, said so in meta."""
    partial = out.with_suffix(".partial.jsonl")
    runs = list(_finished_runs(partial, SETTING).values())
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(partial.stat().st_mtime)),
        "machine": f"{cpu_model()}, {os.cpu_count()} cores",
        "jobs": 2,
        "setting": SETTING,
        "seeds": sorted({r["seed"] for r in runs}),
        "alphas": sorted({r["alpha"] for r in runs}),
        "losses": {loss: ALL_LOSSES[loss] for loss in dict.fromkeys(r["loss"] for r in runs) if loss in ALL_LOSSES},
        "wall_s": float("nan"),
        "partial": f"{len(runs)} of {len(LOSSES) * len(ALPHAS) * 3} runs of the documented grid",
        "command": "python benchmarks/offpolicy_stability.py  # resumes; then --report",
    }
    return {"meta": meta, "runs": runs}


def _cell_key(cell: tuple[str, list[str], int, int] | dict[str, Any]) -> tuple[str, int, int]:
    if isinstance(cell, dict):
        return cell["loss"], cell["alpha"], cell["seed"]
    loss, _, alpha, seed = cell
    return loss, alpha, seed


def _finished_runs(partial: Path | None, setting: dict[str, Any]) -> dict[tuple[str, int, int], dict[str, Any]]:
    if partial is None or not partial.exists():
        return {}
    lines = [json.loads(line) for line in partial.read_text().splitlines() if line.strip()]
    return {_cell_key(x["run"]): x["run"] for x in lines if x["setting"] == setting}


def _report(cell: dict[str, Any]) -> dict[str, Any]:
    print(
        f"{cell['loss']:>22} alpha={cell['alpha']} seed={cell['seed']}: pass@1 {cell['before']:.3f} -> "
        f"{cell['after']:.3f} (best {cell['best']:.3f}), staleness {cell['staleness_mean']:.2f}, "
        f"{cell['wall_s']:.0f} s",
        flush=True,
    )
    return cell


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 steps, alpha 0 and 2, 1 seed; writes only --out")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--alphas", type=int, nargs="+", default=list(ALPHAS))
    ap.add_argument("--losses", nargs="+", default=list(LOSSES), choices=list(ALL_LOSSES))
    ap.add_argument("--steps", type=int, default=SETTING["steps"])
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (1 torch thread each)")
    ap.add_argument("--out", type=Path, default=None, help="results JSON (default: docs/results/, not with --quick)")
    ap.add_argument("--report", action="store_true", help="only rewrite the table and PNG from the results JSON")
    ap.add_argument("--partial", action="store_true",
                    help="with --report: the results JSON from the runs the documented grid finished so far")
    args = ap.parse_args(argv)
    if args.report:
        from offpolicy_stability_report import write_report

        result = json.loads(RESULTS.read_text()) if not args.partial else _partial_result(RESULTS)
        result["summary"] = summarise(result["runs"])
        if args.partial:
            RESULTS.write_text(json.dumps(result, indent=1))
        write_report(result)
        return result
    setting = dict(QUICK) if args.quick else {**SETTING, "steps": args.steps}
    seeds, alphas = ([0], [0, 2]) if args.quick else (args.seeds, args.alphas)
    data = DATA if args.out is None else args.out.parent / "offpolicy-carry"
    write_carry_task(data)
    # The alphas the acceptance reads (0, 8, 16) first, then the others from the largest down (if
    # nothing holds at 8, the question is the largest alpha where something does), so a grid cut
    # short still answers it; critic runs, the slowest, start first so the pool does not end on one.
    cells = sorted(
        ((loss, ALL_LOSSES[loss], alpha, seed) for seed in seeds for alpha in alphas for loss in args.losses),
        key=lambda c: (c[2] not in FIRST_ALPHAS, -c[2] if c[2] not in FIRST_ALPHAS else 0,
                       not c[0].startswith("asyppo"), c[3], c[2]),
    )
    out = args.out or (None if args.quick else RESULTS)
    partial = None if out is None else out.with_suffix(".partial.jsonl")
    began, t0 = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), time.perf_counter()
    runs = run_grid(cells, setting, data, args.jobs, partial)
    meta = {
        "date": began,
        "machine": f"{cpu_model()}, {os.cpu_count()} cores",
        "jobs": args.jobs,
        "setting": setting,
        "seeds": seeds,
        "alphas": alphas,
        "losses": {loss: ALL_LOSSES[loss] for loss in args.losses},
        "wall_s": time.perf_counter() - t0,
        "load_avg": os.getloadavg()[0],
        "command": shlex.join(["python", "benchmarks/offpolicy_stability.py", *(sys.argv[1:] if argv is None else argv)]),
    }
    result = {"meta": meta, "runs": runs, "summary": summarise(runs)}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
    if out is not None:
        from offpolicy_stability_report import write_report

        # The documented grid writes docs/async.md; any other --out gets its own table and PNG beside it.
        where = {} if out == RESULTS else {"doc": out.with_suffix(".md"), "png": out.with_suffix(".png")}
        write_report(result, **where)
    return result


if __name__ == "__main__":
    main()
