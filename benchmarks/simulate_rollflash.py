"""ROLL Flash's cluster figures, simulated: `cadence simulate` against the paper.

    python benchmarks/simulate_rollflash.py            # every comparison and curve (~15 min on 2 busy cores)
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--report", action="store_true", help="Only rewrite the doc table and PNGs from the JSON.")
    args = ap.parse_args()
    if args.report:
        results = json.loads(RESULTS.read_text())
    else:
        began, load_before = time.perf_counter(), os.getloadavg()
        results = {"comparisons": run_comparisons(), "curves": run_curves()}
        results["meta"] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "wall_s": time.perf_counter() - began,
                           "load_before": load_before, "load_after": os.getloadavg()}
        results["presets"] = {name: load_sim_config(name).model_dump() for name in (THINK, BASE)}
        results["cost_model"] = {name: cost_summary(load_sim_config(name)) for name in (THINK, BASE)}
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=2))
    plot(results)
    write_doc(results)
    for c in results["comparisons"]:
        print(f"{c['name']}: paper {c['paper']}, simulated {c['simulated']:.2f}, within 15%: {c['within_15pct']}")


if __name__ == "__main__":
    main()
