"""Environment-level async vs lock-step rollout under slow, fail-slow and fail-stop environments.

    python benchmarks/env_async.py            # the tables in docs/results.md (~75 min on 2 quiet cores)
    python benchmarks/env_async.py --quick    # smoke run (mock engine, no sweep; writes no docs)

Every variant is an end-to-end `cadence train` run in this process (inline
runtime, the machine's cores), on the same episodes: the documented example
environment (examples/envs/guess_number.py) from the same seeds, `rollout.prompts_per_step` groups of `rollout.group_size`
episodes a step, up to `env.max_turns` turns each, the whole response passed
to the environment (`env.action_tag=null`, so every turn steps it). Each
environment step waits `max(0, N(mean, std))` seconds with std = mean
(ROLL Flash's simulated-latency test), 5% of steps take 10x that (fail-slow)
and 1% never answer (fail-stop: the episode ends at `env.step_timeout_s`
and a new one is played on the same seed).

  lock-step sync       rollout.env_mode=lockstep: a step's episodes advance
                       turn by turn together, each turn waiting for the
                       slowest generation and then the slowest environment
  env-level async      one coroutine per episode, no barrier (the default)
  async + redundancy   rollout.redundancy extra episodes per group (a group
                       keeps its first group_size) and rollout.extra_groups
                       extra groups in flight (a step keeps the first groups)

each with alpha = 0 (synchronous training) and alpha = 2 (the rollout may
run two policy versions ahead of the trainer), plus a redundancy sweep at
alpha = 0: bigger groups (more episodes per group) vs more groups.

Two engines: the real embedded engine with the built-in model (CPU: its
decode is part of every turn), and the mock engine with a GPU-like decode
cost (20 ms per step plus 0.05 ms per running row, whatever the context),
so the result says what the environment side does when generation is cheap.
Training is real in both (the built-in model on CPU).

episodes/s = episodes trained / seconds of the timed training steps (the
first `--warmup` steps excluded); engine busy = engine busy seconds over the
same span. Results go to docs/results/env_async.json and the tables in
docs/results.md between the env-async markers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

from cadence.observe.report import write_doc_table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import TIMING_ONLY, cpu_model, timed_steps, train_run  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "results.md"  # the env-async table lives with the other measurements
RESULTS = ROOT / "docs" / "results" / "env_async.json"
COMMAND = "python benchmarks/env_async.py"

LATENCY_MEAN_S = 0.5
MAX_TURNS = 12
MAX_POSITIONS = 1024  # 12 turns of GuessNumber reach ~700 tokens; the built-in model was made with 512
COMMON = [
    # The documented example environment: short observations keep training cheap on the CPU.
    f"env.name=python:{ROOT}/examples/envs/guess_number.py:GuessNumber",
    "env.action_tag=null",  # every turn steps the environment (and pays its latency)
    f"env.max_turns={MAX_TURNS}",  # agentic tasks run many turns; lock-step pays the tail on each
    f"env.latency.mean_s={LATENCY_MEAN_S}",
    f"env.latency.std_s={LATENCY_MEAN_S}",
    "env.latency.fail_slow_share=0.05",
    "env.latency.fail_slow_factor=10",
    "env.latency.fail_stop_share=0.01",
    "env.step_timeout_s=10",
    # 64 episodes a step (ROLL Flash's test had 256): lock-step waits on the slowest of all of them.
    "rollout.prompts_per_step=16",
    "rollout.group_size=4",
    "rollout.max_new_tokens=8",
    "rollout.engine.max_batch_size=64",
    "trainer.micro_batch_size=32",
    *TIMING_ONLY,
    "runtime.kind=inline",
    "runtime.threads=1",  # one torch thread: the machine is shared
]
ENGINES = {
    "embedded": [],
    # A GPU-like decode: a step costs about the same whatever the rows (memory-bound).
    "mock": [
        "rollout.engine.backend=mock",
        "rollout.engine.mock.vocab_size=256",  # ids the built-in model can train on
        "rollout.engine.mock.length_dist=fixed",
        "rollout.engine.mock.median_tokens=8",
        "rollout.engine.mock.step_latency_s=0.02",
        "rollout.engine.mock.per_token_latency_s=0.00005",
    ],
}
REDUNDANCY = ["rollout.redundancy=2", "rollout.extra_groups=2"]
VARIANTS = {
    "lock-step sync": ["rollout.env_mode=lockstep"],
    "env-level async": [],
    "async + redundancy": REDUNDANCY,
}
ALPHAS = (0, 2)
SWEEP = {  # at alpha = 0, on env-level async: where do the extra episodes go?
    "bigger groups: redundancy=1": ["rollout.redundancy=1"],
    "bigger groups: redundancy=2": ["rollout.redundancy=2"],
    "more groups: extra_groups=2": ["rollout.extra_groups=2"],
    "more groups: extra_groups=4": ["rollout.extra_groups=4"],
}
QUICK = [  # seconds, not minutes: structure only
    "rollout.prompts_per_step=2", "rollout.group_size=2", "env.max_turns=2",
    "env.latency.mean_s=0.02", "env.latency.std_s=0.02", "env.step_timeout_s=1",
]


def long_context_model(folder: Path) -> Path:
    """The built-in model with a MAX_POSITIONS context (Llama's RoPE has no learned positions to extend).

    Its text is no better past 512 tokens, which a timing benchmark does not need.
    """
    from cadence.models.loading import BUILTIN_DIR

    target = folder / f"builtin-{MAX_POSITIONS}"
    if not target.exists():
        shutil.copytree(BUILTIN_DIR, target)
        config = json.loads((target / "config.json").read_text())
        config["max_position_embeddings"] = MAX_POSITIONS
        (target / "config.json").write_text(json.dumps(config, indent=2))
    return target


def run_variant(engine: str, name: str, alpha: int, overrides: list[str], steps: int, warmup: int,
                extra: list[str]) -> dict:
    """One training run; its episodes/s and engine busy fraction over the timed steps."""
    with tempfile.TemporaryDirectory() as folder:
        model = f"model.path={long_context_model(Path(folder))}"
        run = train_run([*COMMON, model, *ENGINES[engine], *overrides, f"rollout.async_ratio={alpha}",
                         f"trainer.steps={steps}", *extra])
    records, cfg = run.records, run.cfg
    timed, seconds, episodes = timed_steps(records, warmup)
    busy = timed[-1]["rollout/engine_busy_s"] - records[warmup - 1]["rollout/engine_busy_s"]
    last = timed[-1]
    return {
        "engine": engine,
        "variant": name,
        "alpha": alpha,
        "overrides": overrides,
        "steps_timed": len(timed),
        "episodes": episodes,
        "seconds": seconds,
        "episodes_per_s": episodes / seconds,
        "engine_busy_fraction": busy / seconds,
        "step_seconds": seconds / len(timed),
        "step_seconds_each": [r["time/step"] for r in timed],  # fail-stops make single steps noisy
        "train_seconds": sum(r["train/seconds"] for r in timed) / len(timed),
        "trainer_idle_s": sum(r["time/trainer_idle"] for r in timed) / len(timed),
        "staleness_max": max(r["train/staleness_max"] for r in timed),
        "episodes_played": last["rollout/episodes_total"],
        "episodes_cancelled": last["rollout/episodes_cancelled_total"],
        "episodes_lost_timeout": last["rollout/episodes_lost_timeout_total"],
        "groups_stale_cancelled": last.get("rollout/groups_stale_cancelled_total", 0.0),
        "turns_per_episode": last["rollout/turns_per_episode"],
        "batch_episodes": cfg.rollout.prompts_per_step * cfg.rollout.group_size,
        "wall_s": run.wall_s,
    }


def ratio_to(rows: list[dict], row: dict, variant: str) -> float:
    base = next((r for r in rows if r["engine"] == row["engine"] and r["variant"] == variant and r["alpha"] == 0), None)
    return row["episodes_per_s"] / base["episodes_per_s"] if base else float("nan")  # (a subset run)


def setting(meta: dict, key: str) -> str:
    """The value the runs had for override `key` (the last one wins, as in load_config)."""
    settings = meta["settings"]
    given = [o for o in [*settings["common"], *settings["quick"], *settings.get("set", [])] if o.startswith(f"{key}=")]
    return given[-1].split("=", 1)[1]


def markdown(result: dict) -> str:
    meta, rows, sweep = result["meta"], result["rows"], result["sweep"]
    mean = float(setting(meta, "env.latency.mean_s"))
    lines = [
        f"Measured {meta['date']} on {meta['machine']} (1-minute load "
        f"average {meta['loadavg_before'][0]:.1f} before, {meta['loadavg_after'][0]:.1f} after), "
        f"{meta['steps']} training steps per run ({meta.get('sweep_steps', meta['steps'])} in the sweep), "
        f"the first {meta['warmup']} not timed; {meta['batch_episodes']} episodes a step, "
        f"up to {setting(meta, 'env.max_turns')} turns each, step latency N({mean:g} s, {mean:g} s), 5% fail-slow "
        f"(x10), 1% fail-stop ({float(setting(meta, 'env.step_timeout_s')):g} s step timeout). Reproduce with `{meta['command']}` "
        f"(`docs/results/env_async.json` has every run and every step).",
        "",
        "| engine | variant | alpha | episodes/s | x lock-step (alpha 0) | x async (alpha 0) | engine busy "
        "| step s (fastest-slowest) | train s/step | trainer idle s/step | step timeouts (run) "
        "| episodes cancelled (run) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        each = r.get("step_seconds_each", [r["step_seconds"]])
        lines.append(
            f"| {r['engine']} | {r['variant']} | {r['alpha']} | {r['episodes_per_s']:.2f} | "
            f"{ratio_to(rows, r, 'lock-step sync'):.2f}x | {ratio_to(rows, r, 'env-level async'):.2f}x | "
            f"{r['engine_busy_fraction']:.0%} | {r['step_seconds']:.1f} ({min(each):.0f}-{max(each):.0f}) | "
            f"{r['train_seconds']:.1f} | {r['trainer_idle_s']:.1f} | "
            f"{r['episodes_lost_timeout']:.0f} | {r['episodes_cancelled']:.0f} |"
        )
    if sweep:
        lines += [
            "",
            "Redundancy sweep (env-level async, alpha = 0): the same extra episodes as more episodes per "
            "group (`rollout.redundancy`) or as more groups in flight (`rollout.extra_groups`).",
            "",
            "| engine | extra episodes as | episodes/s | x async without redundancy | engine busy | episodes played |",
            "|---|---|---|---|---|---|",
        ]
        for r in sweep:
            lines.append(
                f"| {r['engine']} | {r['variant']} | {r['episodes_per_s']:.2f} | "
                f"{ratio_to(rows, r, 'env-level async'):.2f}x | {r['engine_busy_fraction']:.0%} | "
                f"{r['episodes_played']:.0f} |"
            )
    return "\n".join(lines)


def write_doc(table: str) -> None:
    write_doc_table(DOC, "env-async", table)


def main() -> None:
    ap = argparse.ArgumentParser()
    # 3 timed steps a run (lock-step steps take minutes); one fail-stop more or less moves an async step by 10-20 s.
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--sweep-steps", type=int, default=3, help="training steps of each sweep run (warm-up included)")
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    ap.add_argument("--sweep-engines", nargs="*", default=["mock"], choices=list(ENGINES))
    ap.add_argument("--alphas", nargs="+", type=int, default=list(ALPHAS))
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS),
                    help="a subset (with --out: a side run that leaves docs/results.md alone)")
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny batches, little latency, no files")
    ap.add_argument("--out", type=Path, default=None, help="write the results JSON here (default: only in a full run)")
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                    help="overrides for every run (e.g. rollout.prompts_per_step=16); with --out: a side run")
    ap.add_argument("--report", action="store_true", help="only rewrite the docs table from the results JSON")
    args = ap.parse_args()
    if args.report:
        write_doc(markdown(json.loads(RESULTS.read_text())))
        return
    full = set(args.variants) == set(VARIANTS) and set(args.alphas) == set(ALPHAS) and not args.set
    if not full and args.out is None and not args.quick:
        ap.error("a subset of --variants/--alphas, or --set, needs --out (it must not replace the full results)")
    steps, warmup = (2, 1) if args.quick else (args.steps, args.warmup)
    extra = [*(QUICK if args.quick else []), *args.set]
    engines = ["mock"] if args.quick else args.engines
    began, load_before = time.perf_counter(), os.getloadavg()
    rows, sweep = [], []
    for engine in engines:
        for alpha in args.alphas:
            for name in args.variants:
                overrides = VARIANTS[name]
                rows.append(run_variant(engine, name, alpha, overrides, steps, warmup, extra))
                print(json.dumps(rows[-1]), flush=True)
    for engine in args.sweep_engines if not args.quick else []:  # the sweep's runs are run_variant's too
        for name, overrides in SWEEP.items():
            sweep.append(run_variant(engine, name, 0, overrides, args.sweep_steps, warmup, extra))
            print(json.dumps(sweep[-1]), flush=True)
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{cpu_model()}, {os.cpu_count()} cores, {platform.system()}",
        "command": " ".join([COMMAND, shlex.join(sys.argv[1:])]).strip(),  # as run: the reproduce line is exact
        "steps": steps,
        "sweep_steps": args.sweep_steps,
        "warmup": warmup,
        "batch_episodes": rows[0]["batch_episodes"],
        "settings": {"common": COMMON, "engines": ENGINES, "quick": QUICK if args.quick else [], "set": args.set},
        "loadavg_before": list(load_before),
        "loadavg_after": list(os.getloadavg()),
        "wall_s": time.perf_counter() - began,
    }
    result = {"meta": meta, "rows": rows, "sweep": sweep}
    table = markdown(result)
    print(table)
    out = args.out or (None if args.quick else RESULTS)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))
    if not args.quick and full:
        write_doc(table)


if __name__ == "__main__":
    main()
