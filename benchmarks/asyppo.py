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
# The default run is 200 steps; 100 keep the 9 runs under ~15 minutes on 2 cores
# (held-out pass@1 has already saturated near 1.0 by then).
DEFAULT_STEPS = 100
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
    cpu_start = time.process_time()
    summary = train(cfg)
    cpu_seconds = time.process_time() - cpu_start  # all threads of this process; not load-sensitive
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    # Training steps only: the held-out evaluation before training is a step-0 record of its own.
    records = [r for r in read_jsonl(Path(summary.run_dir) / "metrics.jsonl") if "time/step" in r]

    def mean(key: str) -> float | None:
        values = [r[key] for r in records if key in r]
        return statistics.fmean(values) if values else None

    # Counted after the peak was read: building models again costs memory.
    policy = load_policy(cfg.model.path, cfg.model.dtype)
    policy_params = sum(p.numel() for p in policy.parameters())
    critic_params = 0
    if cfg.algorithm.uses_critics:
        with torch.random.fork_rng():
            critic_params = CriticEnsemble(
                cfg.algorithm.critic, policy, cfg.model.path, seed, cfg.trainer.micro_batch_size
            ).num_parameters()
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
        "cpu_seconds": cpu_seconds,
        "step_seconds": mean("time/step"),
        "trainer_seconds": mean("train/seconds"),
        "trainer_idle_seconds": mean("time/trainer_idle"),
        "critic_seconds": mean("critic/seconds"),
        "peak_rss_mib": peak_rss_mib,
        "policy_params": policy_params,
        "critic_params": critic_params,
        "final_explained_variance": [
            v for k, v in sorted(last.items()) if k.startswith("critic/explained_variance_")
        ],
        "adv_masked_fraction": mean("asyppo/adv_masked_fraction"),
        "train_accuracy_last10": statistics.fmean(r["reward/accuracy"] for r in records[-10:]),
        # per-step curves (training batch, not the held-out set), for the plot
        "curves": {k: [_round(r.get(k)) for r in records] for k in curve_keys},
    }


def _round(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, 4)


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


def _paired(runs: list[dict], method: str, base: str, key: str, op) -> dict | None:
    """Per-seed op(method, base) over the seeds both ran: pairs cancel machine-load drift."""
    by_seed = {r["seed"]: r[key] for r in runs if r["method"] == base}
    return _stats([op(r[key], by_seed[r["seed"]]) for r in runs
                   if r["method"] == method and r["seed"] in by_seed])


def summarise(runs: list[dict]) -> dict:
    """Per-method statistics over seeds, and per-seed comparisons with PPO and GRPO."""
    methods: dict[str, dict] = {}
    ran = {r["method"] for r in runs}
    for method in METHODS:
        mine = [r for r in runs if r["method"] == method]
        if not mine:
            continue
        m = {
            key: _stats([r[key] for r in mine])
            for key in (
                "pass_at_1_before", "pass_at_1_after", "train_accuracy_last10", "step_seconds",
                "trainer_seconds", "trainer_idle_seconds", "critic_seconds", "cpu_seconds", "peak_rss_mib",
                "adv_masked_fraction",
            )
        }
        m["critic_params"] = mine[0]["critic_params"]
        m["policy_params"] = mine[0]["policy_params"]
        # fp32 weights + gradients + AdamW's two moments: 16 bytes per critic parameter
        m["critic_state_mib"] = 16 * m["critic_params"] / 2**20
        if "ppo" in ran:
            m["step_time_vs_ppo"] = _paired(runs, method, "ppo", "step_seconds", lambda a, b: a / b)
            m["peak_rss_vs_ppo"] = _paired(runs, method, "ppo", "peak_rss_mib", lambda a, b: a / b)
        if "grpo" in ran:  # what the critics add on top of the critic-free run
            m["rss_over_grpo_mib"] = _paired(runs, method, "grpo", "peak_rss_mib", lambda a, b: a - b)
            m["trainer_seconds_over_grpo"] = _paired(
                runs, method, "grpo", "trainer_seconds", lambda a, b: a - b
            )
        methods[method] = m
    if "ppo" in methods and methods["ppo"]["critic_params"]:
        for m in methods.values():
            m["critic_params_vs_ppo"] = m["critic_params"] / methods["ppo"]["critic_params"]
    return methods


def acceptance(methods: dict) -> dict[str, bool] | None:
    """Issue 6's bars for AsyPPO against PPO, on means over seeds.

    Accuracy compares means with a 1e-9 tolerance: pass@1 is a count over the
    test set, and equal counts must not differ by float rounding.
    """
    if not {"ppo", "asyppo"} <= methods.keys():
        return None
    a, p = methods["asyppo"], methods["ppo"]
    return {
        "critic_params_at_most_half_of_ppo": a["critic_params"] <= 0.5 * p["critic_params"],
        "step_time_below_ppo": a["step_seconds"]["mean"] < p["step_seconds"]["mean"],
        "peak_rss_below_ppo": a["peak_rss_mib"]["mean"] < p["peak_rss_mib"]["mean"],
        "accuracy_not_below_ppo": a["pass_at_1_after"]["mean"] >= p["pass_at_1_after"]["mean"] - 1e-9,
    }


def _pm(s: dict | None, fmt: str, suffix: str = "") -> str:
    if s is None:
        return "–"
    return f"{format(s['mean'], fmt)}{suffix} ± {format(s['std'], fmt)}"


def markdown_tables(methods: dict, seeds: list[int]) -> str:
    """Accuracy and cost tables: mean ± sample std over seeds ("vs"/"over" columns per seed)."""
    n = len(seeds)
    acc = [
        f"| method | held-out pass@1 before | held-out pass@1 after (mean ± std, n={n}) "
        "| after, per seed | train accuracy, last 10 steps |",
        "|---|---|---|---|---|",
    ]
    cost = [
        "| method | step time (s) | vs PPO | trainer time (s) | critic update (s) | CPU time (s) "
        "| peak RSS (MiB) | vs PPO | RSS over GRPO (MiB) | critic params | vs PPO "
        "| critic state (MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in methods.items():
        after = m["pass_at_1_after"]
        per_seed = " / ".join(f"{v:.3f}" for v in after["values"]) if after else "–"
        acc.append(
            f"| {name} | {_pm(m['pass_at_1_before'], '.3f')} | {_pm(after, '.3f')} | {per_seed} "
            f"| {_pm(m['train_accuracy_last10'], '.3f')} |"
        )
        cost.append(
            f"| {name} | {_pm(m['step_seconds'], '.3f')} | {_pm(m.get('step_time_vs_ppo'), '.2f', 'x')} "
            f"| {_pm(m['trainer_seconds'], '.3f')} | {_pm(m['critic_seconds'], '.3f')} "
            f"| {_pm(m['cpu_seconds'], '.0f')} "
            f"| {_pm(m['peak_rss_mib'], '.1f')} | {_pm(m.get('peak_rss_vs_ppo'), '.3f', 'x')} "
            f"| {_pm(m.get('rss_over_grpo_mib'), '.1f')} "
            f"| {m['critic_params']:,} | {_ratio(m.get('critic_params_vs_ppo'))} "
            f"| {m['critic_state_mib']:.1f} |"
        )
    return "\n".join(acc) + "\n\n" + "\n".join(cost) + "\n"


def _ratio(x: float | None) -> str:
    return "–" if not x else f"{x:.3f}x"


def plot(runs: list[dict], path: Path) -> None:
    """Training accuracy and critic explained variance against step (10-step means over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def smooth(curves: list[list[float | None]]) -> list[float]:
        steps = min(len(c) for c in curves)
        per_step = []
        for i in range(steps):
            vals = [c[j] for c in curves for j in range(max(0, i - 9), i + 1)
                    if c[j] is not None and math.isfinite(c[j])]
            per_step.append(statistics.fmean(vals) if vals else math.nan)
        return per_step

    fig, (ax_acc, ax_ev) = plt.subplots(1, 2, figsize=(11, 4))
    colors = dict(zip(METHODS, ("tab:blue", "tab:orange", "tab:green"), strict=True))
    for method in METHODS:
        mine = [r for r in runs if r["method"] == method]
        if not mine:
            continue
        acc = smooth([r["curves"]["reward/accuracy"] for r in mine])
        ax_acc.plot(range(1, len(acc) + 1), acc, label=method, color=colors[method])
        ev_keys = [k for k in mine[0]["curves"] if k.startswith("critic/explained_variance_")]
        if ev_keys:
            ev = smooth([r["curves"][k] for r in mine for k in ev_keys])
            ax_ev.plot(range(1, len(ev) + 1), ev, label=method, color=colors[method])
    ax_acc.set(xlabel="step", ylabel="training-batch accuracy", title="accuracy (10-step mean, all seeds)")
    ax_ev.set(xlabel="step", ylabel="explained variance", title="critics' explained variance")
    ax_ev.axhline(0, color="grey", lw=0.5)
    for ax in (ax_acc, ax_ev):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


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


def code_version() -> dict:
    """Which cadence ran: the imported package's folder and, if it is this checkout, its commit."""
    import torch

    import cadence

    package = Path(cadence.__file__).resolve().parent
    info = {"cadence": str(package), "torch": torch.__version__}
    if package.parent == ROOT:
        git = ["git", "-C", str(ROOT)]
        commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run([*git, "status", "--porcelain", "cadence"], capture_output=True, text=True)
        info["commit"] = commit.stdout.strip() or None
        info["cadence_modified"] = bool(dirty.stdout.strip())
    return info


def run_all(methods: list[str], seeds: list[int], steps: int, sets: dict, workdir: Path) -> list[dict]:
    runs = []
    for seed in seeds:  # seed-major: drift in machine load hits all methods alike
        for method in methods:
            t0 = time.perf_counter()
            r = spawn(method, seed, steps, sets[method], workdir)
            runs.append(r)
            print(
                f"{method:7s} seed {seed}: pass@1 {r['pass_at_1_before']:.3f} -> "
                f"{r['pass_at_1_after']:.3f}, step {r['step_seconds']:.3f} s, "
                f"peak RSS {r['peak_rss_mib']:.1f} MiB ({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    return runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=None,
                        help=f"training steps per run (default {DEFAULT_STEPS}; --quick: 3)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds (default 0 1 2)")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--set", action="append", default=[], metavar="METHOD:KEY=VALUE",
                        help="extra config override for one method (repeatable)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 3 steps, seed 0, 4 prompts/step, 16 test prompts")
    parser.add_argument("--out", type=Path, default=None,
                        help="write results.json, table.md, asyppo.png and the runs here instead of "
                        "docs/ (required with --quick)")
    # internal: one run in this process
    parser.add_argument("--one", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.one:
        extra = parse_sets(args.set)[args.one]
        result = run_one(args.one, args.seed, args.steps or DEFAULT_STEPS, args.run_dir, extra)
        args.result.write_text(json.dumps(result, indent=2))
        return

    if args.quick and args.out is None:
        raise SystemExit("--quick writes a smoke-test result: give --out DIR so docs/ are not overwritten")
    steps = args.steps or (3 if args.quick else DEFAULT_STEPS)
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    sets = parse_sets(args.set)
    if args.quick:
        sets = {m: QUICK + v for m, v in sets.items()}

    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="asyppo-bench-") as tmp:
        workdir = args.out / "runs" if args.out is not None else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        runs = run_all(args.methods, seeds, steps, sets, workdir)
    wall = time.perf_counter() - began

    methods = summarise(runs)
    bars = acceptance(methods)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    report = {
        "command": " ".join(["python benchmarks/asyppo.py", *(argv if argv is not None else sys.argv[1:])]),
        "steps": steps,
        "seeds": seeds,
        "overrides": {m: COMMON + sets[m] for m in args.methods},
        "machine": {"cpus": cpus, "torch_threads": 1, "platform": platform.platform(),
                    "python": platform.python_version()},
        "code": code_version(),
        "wall_seconds": wall,
        "methods": methods,
        "acceptance": bars,
        "runs": runs,
    }
    tables = markdown_tables(methods, seeds)
    footer = (
        f"{steps} steps, seeds {' '.join(map(str, seeds))}; {wall / 60:.1f} min for the whole "
        f"benchmark on a {cpus}-core CPU, 1 torch thread per run."
    )
    out = args.out if args.out is not None else RESULTS.parent
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.json" if args.out is not None else RESULTS
    results.write_text(json.dumps(report, indent=2) + "\n")
    plot(runs, out / "asyppo.png")
    if args.out is not None:
        (out / "table.md").write_text(tables + "\n" + footer + "\n")
    else:
        write_doc_table(DOC, tables, footer)
    print(f"\n{tables}\n{footer}")
    for bar, ok in (bars or {}).items():
        print(f"{'MET ' if ok else 'MISS'} {bar}")


if __name__ == "__main__":
    main()
