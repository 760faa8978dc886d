"""GRPO vs PPO vs AsyPPO on the default task: accuracy, step time, peak memory, critic cost.

    python benchmarks/asyppo.py                      # the table in docs/asyppo.md
    python benchmarks/asyppo.py --steps 50 --seeds 0  # a shorter look
    python benchmarks/asyppo.py --quick --out /tmp/q  # smoke test: a few steps, one seed

Every (method, seed) runs `cadence train` with the default config (built-in
model, task arith) in a fresh subprocess (`--one`), so each run's peak memory
is its own: the child reports `getrusage(RUSAGE_SELF).ru_maxrss` of the
training process (policy, engine copy, critics and their optimizers all live
there; the reward workers are identical for every method and not counted).
Methods differ only in `algorithm.name` (and its preset) plus any
`--set method:key=value` overrides, which are recorded in the results file.
Runs are sequential: the machine has 2 cores and torch uses 1 thread.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "asyppo.md"
RESULTS = ROOT / "docs" / "results" / "asyppo.json"
TABLE_START, TABLE_END = "<!-- asyppo-table-start -->", "<!-- asyppo-table-end -->"

METHODS = ("grpo", "ppo", "asyppo")
# Same for every run: no progress bar, no TensorBoard, one checkpoint at the end only.
COMMON = [
    "logging.progress=false",
    "logging.tensorboard=false",
    "checkpoint.every=0",
    "runtime.threads=1",
]
# --quick: a smoke test of the whole pipeline, not a measurement.
QUICK = ["task.test_size=16", "rollout.prompts_per_step=4"]


# ---- one run, in its own process ----------------------------------------------


def run_one(method: str, seed: int, steps: int, run_dir: str, extra: list[str]) -> dict:
    """Train one configuration in this process and return its measurements."""
    import torch

    from cadence.config import load_config
    from cadence.models.loading import load_policy
    from cadence.observe.metrics import read_jsonl
    from cadence.recipes.train_rlvr import train
    from cadence.train.critics import CriticEnsemble

    overrides = [
        f"algorithm.name={method}",
        f"seed={seed}",
        f"rollout.engine.seed={seed}",  # the sampler's seed is separate from `seed`
        f"trainer.steps={steps}",
        f"logging.run_dir={run_dir}",
        *COMMON,
        *extra,
    ]
    cfg = load_config(None, overrides)
    summary = train(cfg)
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    records = read_jsonl(Path(summary.run_dir) / "metrics.jsonl")

    def mean(key: str) -> float | None:
        values = [r[key] for r in records if key in r]
        return statistics.fmean(values) if values else None

    critic_params = 0
    if cfg.algorithm.uses_critics:  # counted after the peak was read: rebuilding costs memory
        policy = load_policy(cfg.model.path, cfg.model.dtype)
        with torch.random.fork_rng():
            critic_params = CriticEnsemble(
                cfg.algorithm.critic, policy, cfg.model.path, seed, cfg.trainer.micro_batch_size
            ).num_parameters()
        policy_params = sum(p.numel() for p in policy.parameters())
    else:
        policy_params = sum(p.numel() for p in load_policy(cfg.model.path).parameters())
    last = records[-1] if records else {}
    curve_keys = ["reward/accuracy", "critic/disagreement"] + sorted(
        k for k in last if k.startswith("critic/explained_variance_")
    )
    return {
        "method": method,
        "seed": seed,
        "steps": steps,
        "overrides": overrides,
        "pass_at_1_before": summary.eval_before.pass_at_1 if summary.eval_before else None,
        "pass_at_1_after": summary.eval_after.pass_at_1 if summary.eval_after else None,
        "train_seconds": summary.seconds,
        "step_seconds": mean("time/step"),
        "trainer_seconds": mean("train/seconds"),
        "rollout_seconds": mean("time/rollout"),
        "critic_seconds": mean("critic/seconds"),
        "peak_rss_mib": peak_rss_mib,
        "policy_params": policy_params,
        "critic_params": critic_params,
        "final_train_accuracy": last.get("reward/accuracy"),
        "final_explained_variance": [
            v for k, v in sorted(last.items()) if k.startswith("critic/explained_variance_")
        ],
        "adv_masked_fraction": mean("asyppo/adv_masked_fraction"),
        # per-step curves (training batch, not the held-out set), for the plot
        "curves": {k: [r.get(k) for r in records] for k in curve_keys},
    }


# ---- the driver ---------------------------------------------------------------


def spawn(method: str, seed: int, steps: int, extra: list[str], workdir: Path) -> dict:
    """`run_one` in a fresh interpreter; its log goes to workdir/<method>_<seed>.log."""
    result = workdir / f"{method}_{seed}.json"
    cmd = [
        sys.executable, __file__, "--one", method, "--seed", str(seed), "--steps", str(steps),
        "--run-dir", str(workdir / f"{method}_{seed}"), "--result", str(result),
    ]
    cmd += [arg for item in extra for arg in ("--set", f"{method}:{item}")]
    log = workdir / f"{method}_{seed}.log"
    with log.open("w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise RuntimeError(f"{method} seed {seed} failed (exit {proc.returncode}):\n{tail}")
    return json.loads(result.read_text())


def _stats(values: list[float | None]) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
        "values": values,
    }


def summarise(runs: list[dict]) -> dict:
    """Per-method statistics over seeds, and ratios to PPO where PPO ran."""
    methods: dict[str, dict] = {}
    for method in METHODS:
        mine = [r for r in runs if r["method"] == method]
        if not mine:
            continue
        methods[method] = {
            key: _stats([r[key] for r in mine])
            for key in (
                "pass_at_1_before", "pass_at_1_after", "step_seconds", "trainer_seconds",
                "rollout_seconds", "critic_seconds", "peak_rss_mib", "final_train_accuracy",
                "adv_masked_fraction",
            )
        }
        methods[method]["critic_params"] = mine[0]["critic_params"]
        methods[method]["policy_params"] = mine[0]["policy_params"]
    if "ppo" in methods:
        ppo = methods["ppo"]
        for m in methods.values():
            m["step_time_vs_ppo"] = m["step_seconds"]["mean"] / ppo["step_seconds"]["mean"]
            m["peak_rss_vs_ppo"] = m["peak_rss_mib"]["mean"] / ppo["peak_rss_mib"]["mean"]
            m["critic_params_vs_ppo"] = (
                m["critic_params"] / ppo["critic_params"] if ppo["critic_params"] else None
            )
    return methods


def acceptance(methods: dict) -> dict[str, bool] | None:
    """Issue 6's bars for AsyPPO against PPO (means over seeds)."""
    if not {"ppo", "asyppo"} <= methods.keys():
        return None
    a, p = methods["asyppo"], methods["ppo"]
    return {
        "critic_params_at_most_half_of_ppo": a["critic_params"] <= 0.5 * p["critic_params"],
        "step_time_below_ppo": a["step_seconds"]["mean"] < p["step_seconds"]["mean"],
        "peak_rss_below_ppo": a["peak_rss_mib"]["mean"] < p["peak_rss_mib"]["mean"],
        "accuracy_not_below_ppo": a["pass_at_1_after"]["mean"] >= p["pass_at_1_after"]["mean"],
    }


def _pm(s: dict | None, fmt: str) -> str:
    if s is None:
        return "–"
    return f"{format(s['mean'], fmt)} ± {format(s['std'], fmt)}"


def markdown_table(methods: dict, seeds: list[int]) -> str:
    """The results table (mean ± sample std over seeds; per-seed values in the JSON)."""
    n = len(seeds)
    head = (
        f"| method | pass@1 before | pass@1 after (mean ± std, n={n}) | pass@1 after, per seed "
        "| step time (s) | vs PPO | critic time / step (s) | peak RSS (MiB) | vs PPO "
        "| critic params | vs PPO |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for name, m in methods.items():
        after = m["pass_at_1_after"]
        per_seed = " / ".join(f"{v:.3f}" for v in after["values"]) if after else "–"
        rows.append(
            f"| {name} | {_pm(m['pass_at_1_before'], '.3f')} | {_pm(after, '.3f')} | {per_seed} "
            f"| {_pm(m['step_seconds'], '.4f')} | {m.get('step_time_vs_ppo', math.nan):.2f}x "
            f"| {_pm(m['critic_seconds'], '.4f')} | {_pm(m['peak_rss_mib'], '.1f')} "
            f"| {m.get('peak_rss_vs_ppo', math.nan):.3f}x | {m['critic_params']:,} "
            f"| {_ratio(m.get('critic_params_vs_ppo'))} |"
        )
    return head + "\n".join(rows) + "\n"


def _ratio(x: float | None) -> str:
    return "–" if x is None or x == 0 else f"{x:.3f}x"


def write_doc_table(doc: Path, table: str, footer: str) -> None:
    text = doc.read_text()
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    doc.write_text(text[:start] + "\n" + table + "\n" + footer + "\n" + text[end:])


def parse_sets(items: list[str]) -> dict[str, list[str]]:
    """`--set asyppo:algorithm.critic.critic_lr=1e-3` -> {"asyppo": ["algorithm...=1e-3"]}."""
    out: dict[str, list[str]] = {m: [] for m in METHODS}
    for item in items:
        method, _, override = item.partition(":")
        if method not in out or "=" not in override:
            raise SystemExit(f"--set {item!r}: expected METHOD:key=value with METHOD in {METHODS}")
        out[method].append(override)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (default 200)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds (default 0 1 2)")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--set", action="append", default=[], metavar="METHOD:KEY=VALUE",
                        help="extra config override for one method (repeatable)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 3 steps, seed 0, 4 prompts/step, 16 test prompts")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for results.json and table.md instead of docs/ (required with --quick)")
    # internal: one run in this process
    parser.add_argument("--one", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.one:
        extra = parse_sets(args.set)[args.one]
        result = run_one(args.one, args.seed, args.steps or 200, args.run_dir, extra)
        args.result.write_text(json.dumps(result, indent=2))
        return

    if args.quick and args.out is None:
        raise SystemExit("--quick writes a smoke-test result: give --out DIR so docs/ are not overwritten")
    steps = args.steps or (3 if args.quick else 200)
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    sets = parse_sets(args.set)
    if args.quick:
        sets = {m: QUICK + v for m, v in sets.items()}

    began = time.perf_counter()
    runs = []
    with tempfile.TemporaryDirectory(prefix="asyppo-bench-") as tmp:
        if args.out is not None:  # keep the run folders and logs next to the results
            tmp = str(args.out / "runs")
            Path(tmp).mkdir(parents=True, exist_ok=True)
        for seed in seeds:  # seed-major: drift in machine load hits all methods alike
            for method in args.methods:
                t0 = time.perf_counter()
                runs.append(spawn(method, seed, steps, sets[method], Path(tmp)))
                r = runs[-1]
                print(
                    f"{method:7s} seed {seed}: pass@1 {r['pass_at_1_before']:.3f} -> "
                    f"{r['pass_at_1_after']:.3f}, step {r['step_seconds']:.4f} s, "
                    f"peak RSS {r['peak_rss_mib']:.1f} MiB ({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
    wall = time.perf_counter() - began
    methods = summarise(runs)
    bars = acceptance(methods)
    report = {
        "command": "python benchmarks/asyppo.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "steps": steps,
        "seeds": seeds,
        "overrides": {m: COMMON + sets[m] for m in args.methods},
        "machine": {
            "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "torch_threads": 1,
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "wall_seconds": wall,
        "methods": methods,
        "acceptance": bars,
        "runs": runs,
    }
    table = markdown_table(methods, seeds)
    footer = (
        f"{steps} steps, seeds {' '.join(map(str, seeds))}; {wall / 60:.1f} min for the whole "
        f"benchmark on a {report['machine']['cpus']}-core CPU, 1 torch thread per run."
    )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
        (args.out / "table.md").write_text(table + "\n" + footer + "\n")
    else:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(report, indent=2) + "\n")
        write_doc_table(DOC, table, footer)
    print()
    print(table)
    print(footer)
    if bars is not None:
        for bar, ok in bars.items():
            print(f"{'MET ' if ok else 'MISS'} {bar}")


if __name__ == "__main__":
    main()
