"""ROLL Flash's cluster figures, simulated: `cadence simulate` against the paper.

    python benchmarks/simulate_rollflash.py            # every comparison and curve (~15 min on 2 busy cores)
    python benchmarks/simulate_rollflash.py --agentic  # only the agentic runs (~10 min), into the same JSON
    python benchmarks/simulate_rollflash.py --report   # rewrite docs/scaling.md's table and the PNGs from the JSON

Each comparison names its preset and overrides (the exact inputs), the
paper's figure, the simulated one and the error. Writes
docs/results/simulate.json, docs/results/simulate_*.png and the table in
docs/scaling.md. Simulated time is virtual: the machine's load changes how
long this takes, never the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from cadence.observe.report import write_doc_table
from cadence.simulate import sweeps
from cadence.simulate.config import load_sim_config

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "scaling.md"
RESULTS = ROOT / "docs" / "results" / "simulate.json"
TOLERANCE = 0.15

THINK = "qwen3-8b-think"
BASE = "qwen3-8b-base"
# The curves run many configurations up to 1024 GPUs: a coarser simulated step (256 tokens) keeps
# them to minutes. The paper comparisons use the presets' default (median / 32 = 128 tokens).
CURVE = ["run.tick_tokens=256", "run.warmup_steps=3", "run.steps=3"]


def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def comparison(name: str, paper: float, simulated: float, fitted: bool, setup: dict, detail: dict,
               claim: str, lower_only: bool = False) -> dict:
    """One paper figure against the simulation. lower_only: the claim is 'at least / close to'."""
    error = (simulated - paper) / paper
    ok = error >= -TOLERANCE if lower_only else abs(error) <= TOLERANCE
    return {"name": name, "claim": claim, "paper": paper, "simulated": simulated, "error": error,
            "within_15pct": ok, "fitted": fitted, "setup": setup, "detail": detail}


def run_comparisons() -> list[dict]:
    out = []

    setup = {"preset": THINK, "overrides": []}
    row = sweeps.compare(load_sim_config(THINK, None, setup["overrides"]), log)
    out.append(comparison("async_vs_sync_128", 2.12, row["async_over_sync"], fitted=False, setup=setup, detail=row,
                          claim="async / sync throughput, Qwen3-8B, 128 GPUs"))

    setup = {"preset": THINK, "gpus": [16, 128], "prompts_per_gpu": 4}
    cfg = load_sim_config(THINK, None, ["cluster.gpus=16", "workload.prompts_per_step=64"])
    rows = sweeps.scaling(cfg, [16, 128], log)
    out.append(comparison("scaling_8x", 7.6, rows[-1]["async_scale"], fitted=False, setup=setup,
                          detail={"rows": rows}, claim="async throughput at 8x the GPUs (16 -> 128), x one"))

    short = []
    for gpus in (32, 128):
        setup = {"preset": BASE, "overrides": [f"cluster.gpus={gpus}", f"workload.prompts_per_step={4 * gpus}"]}
        row = sweeps.compare(load_sim_config(BASE, None, setup["overrides"]), log)
        short.append(row)
        # The paper gives a range, 1.53x to 2.24x: a simulated value inside it (within 15%) passes.
        inside = 1.53 * (1 - TOLERANCE) <= row["async_over_sync"] <= 2.24 * (1 + TOLERANCE)
        middle = (1.53 + 2.24) / 2
        entry = comparison(f"short_tailed_{gpus}", middle, row["async_over_sync"], fitted=False, setup=setup,
                           detail=row, claim=f"async / sync on short long-tailed outputs (Qwen3-8B base), {gpus} GPUs; "
                           "paper: 1.53x-2.24x")
        entry["paper"] = "1.53-2.24"
        entry["error"] = 0.0 if 1.53 <= row["async_over_sync"] <= 2.24 else min(
            abs(row["async_over_sync"] - 1.53) / 1.53, abs(row["async_over_sync"] - 2.24) / 2.24)
        entry["within_15pct"] = inside
        out.append(entry)

    setup = {"preset": THINK, "overrides": ["cluster.gpus=40", "workload.prompts_per_step=160"], "train_gpus": [8, 16, 24, 32]}
    rows = sweeps.split(load_sim_config(THINK, None, setup["overrides"]), setup["train_gpus"], log)
    at_16 = next(r for r in rows if r["train_gpus"] == 16)
    entry = comparison("split_40", 2.0, at_16["x_worst"], fitted=False, setup=setup, detail={"rows": rows},
                       claim="40 GPUs: throughput of 24 rollout / 16 train over the poorest split tried")
    entry["best_train_gpus"] = max(rows, key=lambda r: r["samples_per_s"])["train_gpus"]
    out.append(entry)

    setup = {"preset": THINK, "overrides": [], "alphas": [0, 1, 2, 4, 8]}
    rows = sweeps.alpha(load_sim_config(THINK, None, setup["overrides"]), setup["alphas"], log)
    at_2 = next(r for r in rows if r["alpha"] == 2)
    out.append(comparison("alpha_2", 1.0, at_2["of_best"], fitted=False, setup=setup, detail={"rows": rows},
                          claim="alpha = 2 throughput over the best alpha tried (1.0 = the best)", lower_only=True))
    return out


# -- agentic runs: environment latency, redundancy, alpha -----------------------------------

LATENCY = "agentic-latency"
ALFWORLD = "alfworld"
SWE = "swe"
# Training GPUs tried (of 16) for the last rung of each ladder; beta* knows no environment time.
SPLITS = [2, 4, 6, 8]


def _ladder_entry(name: str, paper: float, rows: list[dict], index: int, column: str, setup: dict, claim: str) -> dict:
    return comparison(name, paper, rows[index][column], fitted=False, setup=setup, detail={"rows": rows}, claim=claim)


def run_agentic() -> dict:
    out: list[dict] = []
    # 1. ROLL Flash's latency stress test, N(10 s, 10 s) a step. Turns per episode are not in the
    #    paper: fitted so that the lock-step step takes the paper's 892 s; the async step is predicted.
    tried = []
    for turns in range(17, 24):
        cfg = load_sim_config(LATENCY, None, [f"env.turns={turns}"])
        r = sweeps.simulate(sweeps.lockstep(cfg))
        log(f"fit: {turns} turns -> lock-step {r.step_s:.0f} s a step")
        tried.append({"turns": turns, "lockstep_step_s": r.step_s})
    best = min(tried, key=lambda t: abs(t["lockstep_step_s"] - 892))
    setup = {"preset": LATENCY, "overrides": [f"env.turns={best['turns']}"], "fit": tried}
    rows = sweeps.agentic(load_sim_config(LATENCY, None, setup["overrides"]), train_gpus=SPLITS, progress=log)
    out.append(comparison("env_async_latency", 2.46, rows[1]["x_lockstep"], fitted=False, setup=setup,
                          detail={"rows": rows}, claim="env-level async / lock-step, latency N(10 s, 10 s)"))
    out.append(comparison("latency_lockstep_step", 892.0, rows[0]["step_s"], fitted=True, setup=setup,
                          detail={}, claim="lock-step step seconds, latency N(10 s, 10 s) (turns fitted to it)"))
    out.append(comparison("latency_async_step", 362.0, rows[1]["step_s"], fitted=False, setup=setup,
                          detail={}, claim="env-level async step seconds, latency N(10 s, 10 s)"))
    out.append(_range_entry("redundancy_latency", (1.07, 1.16), rows[2]["x_previous"], setup, rows,
                            "redundant environments over env-level async, latency N(10 s, 10 s)"))
    # 2. ALFWorld-like and SWE-like runs: every input assumed, nothing fitted.
    ladders = {}
    for preset, end_to_end in ((ALFWORLD, 2.72), (SWE, 1.81)):
        setup = {"preset": preset, "overrides": []}
        rows = sweeps.agentic(load_sim_config(preset), train_gpus=SPLITS, progress=log)
        ladders[preset] = rows
        label = "ALFWorld" if preset == ALFWORLD else "SWE"
        if preset == ALFWORLD:
            out.append(_ladder_entry("env_async_alfworld", 1.58, rows, 1, "x_lockstep", setup,
                                     "env-level async / lock-step, ALFWorld-like"))
        out.append(_range_entry(f"redundancy_{preset}", (1.07, 1.16), rows[2]["x_previous"], setup, rows,
                                f"redundant environments over env-level async, {label}-like"))
        out.append(_ladder_entry(f"end_to_end_{preset}", end_to_end, rows, 3, "x_lockstep", setup,
                                 f"end to end (env async + redundancy + alpha 2) / lock-step sync, {label}-like"))
    # 3. Curves: environment latency, fail-slow environments, alpha.
    alfworld = load_sim_config(ALFWORLD)
    latency = sweeps.env_latency(alfworld, [0, 1, 2, 5, 10, 20], log)
    fail_slow = []
    for share in (0.0, 0.02, 0.05, 0.1):
        c = sweeps.variant(alfworld, {"env.latency.fail_slow_share": share})
        plain = sweeps.simulate(c)
        spare = sweeps.simulate(sweeps.variant(c, {"env.redundancy": 2, "env.extra_groups": 1}))
        log(f"fail-slow {share:.0%}: {plain.step_s:.0f} s -> {spare.step_s:.0f} s with redundancy")
        fail_slow.append({"fail_slow_share": share, "step_s": plain.step_s, "redundant_step_s": spare.step_s,
                          "redundancy_gain": spare.samples_per_s / plain.samples_per_s})
    split = ladders[ALFWORLD][-1]["train_gpus"]  # the ladder's best split, kept fixed while alpha changes
    alphas = sweeps.alpha(sweeps.variant(alfworld, {"cluster.colocate": False, "cluster.alpha": 2,
                                                    "cluster.train_gpus": split}), [0, 1, 2, 4], log)
    return {"comparisons": out, "ladders": ladders, "latency": latency, "fail_slow": fail_slow, "alpha": alphas,
            "presets": {name: load_sim_config(name).model_dump() for name in (LATENCY, ALFWORLD, SWE)}}


def _range_entry(name: str, bounds: tuple[float, float], simulated: float, setup: dict, rows: list[dict],
                 claim: str) -> dict:
    """A gain the paper gives as a range (+7% to +16%): the 15% tolerance applies to the gain
    (x - 1), since on the ratio itself it would pass no gain at all. error: distance outside it."""
    low, high = bounds
    entry = comparison(name, (low + high) / 2, simulated, fitted=False, setup=setup, detail={"rows": rows},
                       claim=f"{claim}; paper: +{100 * (low - 1):.0f}% to +{100 * (high - 1):.0f}%")
    entry["paper"] = f"{low:.2f}-{high:.2f}"
    entry["error"] = 0.0 if low <= simulated <= high else min(abs(simulated - low) / low, abs(simulated - high) / high)
    gain = simulated - 1
    entry["within_15pct"] = (low - 1) * (1 - TOLERANCE) <= gain <= (high - 1) * (1 + TOLERANCE)
    return entry


def cost_summary(cfg) -> dict:
    """What the cost model says about one preset: slots, step times, and the theory's inputs."""
    from cadence.simulate.costs import decode_step_s, response_moment
    from cadence.simulate.theory import longest_response, theory_inputs

    t, m, g, ro, w = theory_inputs(cfg), cfg.model, cfg.gpu, cfg.rollout, cfg.workload
    mean, square = response_moment(w, 1), response_moment(w, 2)
    context = w.prompt_tokens + square / (2 * mean)
    longest = longest_response(w)
    return {"slots": t.slots, "mean_response_tokens": mean, "mean_context_tokens": context,
            "decode_step_full_s": decode_step_s(m, g, ro, t.slots, round(t.slots * context)),
            "decode_step_alone_longest_s": decode_step_s(m, g, ro, 1, round(w.prompt_tokens + longest)),
            "mu_gen": t.mu_gen, "l_gen": t.l_gen, "mu_train": t.mu_train}


def run_curves() -> dict:
    think = load_sim_config(THINK, None, [*CURVE, "cluster.gpus=8", "workload.prompts_per_step=32"])
    return {
        "scaling": sweeps.scaling(think, [8, 16, 32, 64, 128, 256, 512, 1024], log),
        "tail": sweeps.tail(load_sim_config(THINK, None, [*CURVE, "cluster.gpus=32", "workload.prompts_per_step=128"]),
                            [0.0, 0.25, 0.5, 0.75, 1.0, 1.25], log),
        "curve_overrides": CURVE,
    }


def plot(results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = RESULTS.parent
    rows = results["curves"]["scaling"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    g = [r["gpus"] for r in rows]
    ax.loglog(g, [r["sync_samples_per_s"] for r in rows], "o-", label="sync (colocated)")
    ax.loglog(g, [r["async_samples_per_s"] for r in rows], "s-", label="async (alpha=2, beta* split)")
    # Linear from 16 GPUs: at 8, beta* rounds to one training GPU and async is training-bound.
    anchor = next((r for r in rows if r["gpus"] == 16), rows[0])
    ax.loglog(g, [anchor["async_samples_per_s"] * x / anchor["gpus"] for x in g], "k:", label="linear from 16 GPUs")
    ax.set_xlabel("GPUs (prompts per step grow with them)")
    ax.set_ylabel("samples / s (simulated)")
    ax.set_title("Qwen3-8B think, H800")
    ax.legend()
    bx.semilogx(g, [r["async_over_sync"] for r in rows], "o-")
    bx.axhline(2.12, color="gray", ls="--", label="paper: 2.12x at 128 GPUs")
    bx.set_xlabel("GPUs")
    bx.set_ylabel("async / sync")
    bx.legend()
    fig.tight_layout()
    fig.savefig(out / "simulate_scaling.png", dpi=120)
    plt.close(fig)

    by_name = {c["name"]: c for c in results["comparisons"]}
    fig, (ax, bx, cx) = plt.subplots(1, 3, figsize=(13, 3.8))
    split = by_name["split_40"]["detail"]["rows"]
    ax.bar([f"{r['rollout_gpus']}/{r['train_gpus']}" for r in split], [r["samples_per_s"] for r in split])
    ax.set_xlabel("rollout / train GPUs (40)")
    ax.set_ylabel("samples / s")
    ax.set_title("split of 40 GPUs")
    alphas = by_name["alpha_2"]["detail"]["rows"]
    bx.plot([r["alpha"] for r in alphas], [r["samples_per_s"] for r in alphas], "o-")
    bx.set_xlabel("alpha (fixed split)")
    bx.set_ylabel("samples / s")
    bx.set_title("asynchronous ratio, 128 GPUs")
    tail = results["curves"]["tail"]
    cx.plot([r["sigma"] for r in tail], [r["async_over_sync"] for r in tail], "o-")
    cx.set_xlabel("lognormal sigma of response length")
    cx.set_ylabel("async / sync")
    cx.set_title("long tails, 32 GPUs")
    fig.tight_layout()
    fig.savefig(out / "simulate_split_alpha_tail.png", dpi=120)
    plt.close(fig)


def write_doc(results: dict) -> None:
    lines = ["| figure | paper | simulated | error | within 15% | fitted? |", "|---|---|---|---|---|---|"]
    for c in results["comparisons"]:
        paper = c["paper"] if isinstance(c["paper"], str) else f"{c['paper']:.2f}"
        lines.append(f"| {c['claim']} | {paper} | {c['simulated']:.2f} | {100 * c['error']:+.0f}% | "
                     f"{'yes' if c['within_15pct'] else 'NO'} | {'fitted' if c['fitted'] else 'predicted'} |")
    by_name = {c["name"]: c for c in results["comparisons"]}
    split = by_name["split_40"]
    lines += ["", "| 40 GPUs: rollout / train | samples/s | x poorest | engine busy |", "|---|---|---|---|"]
    lines += [f"| {r['rollout_gpus']} / {r['train_gpus']} | {r['samples_per_s']:.2f} | {r['x_worst']:.2f}x | "
              f"{r['engine_busy']:.0%} |" for r in split["detail"]["rows"]]
    lines.append(f"\nbeta* (split.py on the cost model) suggests {split['detail']['rows'][0]['beta_star_train_gpus']} "
                 f"training GPUs of 40; the simulation's best is {split['best_train_gpus']}.")
    lines += ["", "| alpha (128 GPUs, fixed split) | samples/s | of best | x sync | mean staleness |", "|---|---|---|---|---|"]
    lines += [f"| {r['alpha']} | {r['samples_per_s']:.2f} | {r['of_best']:.2f} | {r['x_sync']:.2f}x | {r['staleness']:.2f} |"
              for r in by_name["alpha_2"]["detail"]["rows"]]
    lines += ["", "| GPUs | prompts/step | train GPUs (beta*) | sync samples/s | async samples/s | sync x 8 GPUs | "
              "async x 8 GPUs | async / sync | CPU s to simulate (sync / async) |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['gpus']} | {r['prompts_per_step']} | {r['train_gpus']} | {r['sync_samples_per_s']:.2f} | "
              f"{r['async_samples_per_s']:.2f} | {r['sync_scale']:.2f}x | {r['async_scale']:.2f}x | {r['async_over_sync']:.2f}x | "
              f"{r.get('sync_cpu_s', float('nan')):.0f} / {r.get('async_cpu_s', float('nan')):.0f} |"
              for r in results["curves"]["scaling"]]
    lines += ["", "| sigma (32 GPUs) | sync samples/s | async samples/s | async / sync |", "|---|---|---|---|"]
    lines += [f"| {r['sigma']} | {r['sync_samples_per_s']:.2f} | {r['async_samples_per_s']:.2f} | {r['async_over_sync']:.2f}x |"
              for r in results["curves"]["tail"]]
    meta = results["meta"]
    lines.append(f"\nSimulated {meta['date']} in {meta['wall_s'] / 60:.1f} min of wall time (load average "
                 f"{meta['load_before'][0]:.1f} before, {meta['load_after'][0]:.1f} after, shared 2-core machine; "
                 "the numbers are virtual time and do not depend on it). Reproduce: "
                 "`python benchmarks/simulate_rollflash.py`; inputs and every run in `docs/results/simulate.json`.")
    write_doc_table(DOC, "simulate", "\n".join(lines))


def plot_agentic(agentic: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(17, 3.9))
    ax = axes[0]
    names = ["lock-step", "env async", "+ redundancy", "+ alpha 2"]
    width = 0.38
    for offset, (preset, label) in zip((-width / 2, width / 2), ((ALFWORLD, "ALFWorld-like"), (SWE, "SWE-like")), strict=True):
        rows = agentic["ladders"][preset]
        ax.bar([i + offset for i in range(len(rows))], [r["x_lockstep"] for r in rows], width, label=label)
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_ylabel("episodes / s, x lock-step sync")
    ax.set_title("agentic techniques, one on another")
    ax.legend(fontsize=8)
    bx = axes[1]
    lat = agentic["latency"]
    bx.plot([r["latency_s"] for r in lat], [r["async_over_lockstep"] for r in lat], "o-")
    bx.set_xlabel("env step latency N(m, m), m in s")
    bx.set_ylabel("env async / lock-step")
    bx.set_title("environment latency (ALFWorld-like)")
    cx = axes[2]
    slow = agentic["fail_slow"]
    cx.plot([100 * r["fail_slow_share"] for r in slow], [r["step_s"] for r in slow], "o-", label="env async")
    cx.plot([100 * r["fail_slow_share"] for r in slow], [r["redundant_step_s"] for r in slow], "s-",
            label="+ redundancy (2 episodes, 1 group)")
    cx.set_xlabel("fail-slow steps (x10), %")
    cx.set_ylabel("step seconds")
    cx.set_title("fail-slow environments")
    cx.legend(fontsize=8)
    dx = axes[3]
    alphas = agentic["alpha"]
    dx.plot([r["alpha"] for r in alphas], [r["samples_per_s"] for r in alphas], "o-")
    dx.set_xlabel("alpha (fixed split)")
    dx.set_ylabel("episodes / s")
    dx.set_title("asynchronous ratio (ALFWorld-like)")
    fig.tight_layout()
    fig.savefig(RESULTS.parent / "simulate_agentic.png", dpi=120)
    plt.close(fig)


def write_agentic_doc(agentic: dict) -> None:
    lines = ["| figure | paper | simulated | error | within 15% | fitted? |", "|---|---|---|---|---|---|"]
    for c in agentic["comparisons"]:
        paper = c["paper"] if isinstance(c["paper"], str) else f"{c['paper']:.2f}"
        lines.append(f"| {c['claim']} | {paper} | {c['simulated']:.2f} | {100 * c['error']:+.0f}% | "
                     f"{'yes' if c['within_15pct'] else 'NO'} | {'fitted' if c['fitted'] else 'predicted'} |")
    fit = agentic["comparisons"][0]["setup"]["fit"]
    lines.append("\nTurns per episode, fitted to the lock-step 892 s: " + ", ".join(
        f"{t['turns']} turns {t['lockstep_step_s']:.0f} s" for t in fit) + f"; chosen: "
        f"{agentic['comparisons'][0]['setup']['overrides'][0]}.")
    by_name = {c["name"]: c for c in agentic["comparisons"]}
    ladders = [("latency N(10 s, 10 s)", by_name["env_async_latency"]["detail"]["rows"]),
               ("ALFWorld-like", agentic["ladders"][ALFWORLD]), ("SWE-like", agentic["ladders"][SWE])]
    lines += ["", "| setting | run | train GPUs | step s | episodes/s | x lock-step | x previous | engine busy | staleness |",
              "|---|---|---|---|---|---|---|---|---|"]
    for label, rows in ladders:
        lines += [f"| {label} | {r['setting']} | {r['train_gpus']} | {r['step_s']:.0f} | {r['samples_per_s']:.3f} | "
                  f"{r['x_lockstep']:.2f}x | {r['x_previous']:.2f}x | {r['engine_busy']:.0%} | {r['staleness']:.2f} |"
                  for r in rows]
    lines += ["", "| env latency N(m, m), m s (ALFWorld-like) | lock-step step s | env async step s | async / lock-step |",
              "|---|---|---|---|"]
    lines += [f"| {r['latency_s']:g} | {r['lockstep_step_s']:.0f} | {r['async_step_s']:.0f} | {r['async_over_lockstep']:.2f}x |"
              for r in agentic["latency"]]
    lines += ["", "| fail-slow steps (x10) | env async step s | + redundancy step s | gain |", "|---|---|---|---|"]
    lines += [f"| {100 * r['fail_slow_share']:.0f}% | {r['step_s']:.0f} | {r['redundant_step_s']:.0f} | "
              f"{r['redundancy_gain']:.2f}x |" for r in agentic["fail_slow"]]
    lines += ["", "| alpha (ALFWorld-like, env async, fixed split) | episodes/s | of best | x sync | mean staleness |",
              "|---|---|---|---|---|"]
    lines += [f"| {r['alpha']} | {r['samples_per_s']:.3f} | {r['of_best']:.2f} | {r['x_sync']:.2f}x | {r['staleness']:.2f} |"
              for r in agentic["alpha"]]
    meta = agentic["meta"]
    lines.append(f"\nSimulated {meta['date']} in {meta['wall_s'] / 60:.1f} min of wall time ({meta['cpu_s'] / 60:.1f} CPU "
                 f"min; load average {meta['load_before'][0]:.1f} before, {meta['load_after'][0]:.1f} after, shared "
                 "2-core machine; the numbers are virtual time and do not depend on it). Reproduce: "
                 "`python benchmarks/simulate_rollflash.py --agentic`; inputs and every run in "
                 "`docs/results/simulate.json` (`agentic`).")
    write_doc_table(DOC, "simulate-agentic", "\n".join(lines))


def agentic_with_meta() -> dict:
    began, cpu, load_before = time.perf_counter(), time.process_time(), os.getloadavg()
    agentic = run_agentic()
    agentic["meta"] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "wall_s": time.perf_counter() - began,
                       "cpu_s": time.process_time() - cpu, "load_before": load_before, "load_after": os.getloadavg()}
    return agentic


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--report", action="store_true", help="Only rewrite the doc table and PNGs from the JSON.")
    ap.add_argument("--agentic", action="store_true", help="Only (re)run the agentic part, into the same JSON.")
    args = ap.parse_args()
    if args.agentic:
        results = json.loads(RESULTS.read_text())
        results["agentic"] = agentic_with_meta()
        RESULTS.write_text(json.dumps(results, indent=2))
    elif args.report:
        results = json.loads(RESULTS.read_text())
    else:
        began, load_before = time.perf_counter(), os.getloadavg()
        results = {"comparisons": run_comparisons(), "curves": run_curves()}
        results["meta"] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "wall_s": time.perf_counter() - began,
                           "load_before": load_before, "load_after": os.getloadavg()}
        results["presets"] = {name: load_sim_config(name).model_dump() for name in (THINK, BASE)}
        results["agentic"] = agentic_with_meta()
        results["cost_model"] = {name: cost_summary(load_sim_config(name)) for name in (THINK, BASE)}
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=2))
    plot(results)
    write_doc(results)
    if "agentic" in results:
        plot_agentic(results["agentic"])
        write_agentic_doc(results["agentic"])
    for c in results["comparisons"] + results.get("agentic", {}).get("comparisons", []):
        print(f"{c['name']}: paper {c['paper']}, simulated {c['simulated']:.2f}, within 15%: {c['within_15pct']}")


if __name__ == "__main__":
    main()
