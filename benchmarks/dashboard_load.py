"""How fast `cadence dashboard` opens over many long runs, and what its logging costs a run.

    python benchmarks/dashboard_load.py              # 50 runs x 10,000 steps; writes docs/results/dashboard_load.json
    python benchmarks/dashboard_load.py --quick      # 5 runs x 1,000 steps, a smoke test

1. Load: writes `--runs` run folders of `--steps` steps each into a temporary folder
   (metrics.jsonl rows shaped like a real run's, ~1.9 kB each; status.json; summary.json;
   a trainer timeline of 4 spans per step; a full sample log), serves them with
   `python -m cadence.dashboard` as a user would, and measures
   - the API: /api/runs, and opening one run (/metrics, /timeline, /samples), cold
     (the server's first read of that run) and warm;
   - the page in headless chromium: from navigation until the runs table holds every
     run (the acceptance bar: under 2 s), and until a run's charts are drawn.
2. Overhead: the runtime's dashboard logging (timeline spans, staleness, sample log)
   per training step of the default config, timed on the real writers, next to the
   step time of a `cadence train` run with and without it (same run, side by side).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import cpu_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results" / "dashboard_load.json"
DOC = ROOT / "docs" / "dashboard.md"
# The keys of a real `cadence train` metrics row (GRPO, inline).
KEYS = ["train/pg_loss", "train/ratio_mean", "train/ratio_max", "train/ratio_min", "train/approx_kl",
        "train/mismatch_weight_mean", "train/mismatch_masked_fraction", "train/mismatch_kl", "train/response_tokens",
        "train/clip_fraction", "train/dual_clip_fraction", "train/entropy", "train/loss", "train/grad_norm",
        "train/lr", "train/seconds", "train/staleness_mean", "train/staleness_max", "reward/mean", "reward/std",
        "reward/accuracy", "reward/errors", "response/length_mean", "response/length_max",
        "response/truncated_fraction", "response/interrupted_fraction", "time/step", "time/trainer_idle",
        "time/weight_sync", "perf/samples_per_s", "perf/tokens_per_s", "progress/samples_total",
        "buffer/depth_groups", "buffer/dropped_groups", "buffer/dropped_samples", "rollout/engine_busy_fraction",
        "rollout/engine_busy_s", "rollout/engine_steps", "rollout/reward_errors_total", "rollout/samples_total",
        "rollout/in_flight_groups", "rollout/filtered_groups_total"]


# -- 1. load ------------------------------------------------------------------------------------
def write_run(run: Path, steps: int, seed: int) -> None:
    rng = random.Random(seed)
    run.mkdir(parents=True)
    (run / "events").mkdir()
    (run / "config.yaml").write_text(f"seed: {seed}\ntask:\n  name: arith\nalgorithm:\n  name: grpo\ntrainer:\n  steps: {steps}\n")
    t = 1.7e9 + seed * 1e5
    with (run / "metrics.jsonl").open("w") as m, (run / "events" / "trainer.jsonl").open("w") as ev:
        m.write(json.dumps({"step": 0, "eval/pass@1": 0.66, "eval/mean_reward": 0.66}) + "\n")
        for step in range(1, steps + 1):
            row = {"step": step, **{k: rng.random() for k in KEYS}}
            row["reward/mean"] = min(1.0, 0.6 + 0.4 * step / steps + 0.05 * rng.random())
            m.write(json.dumps(row) + "\n")
            ev.write(json.dumps({"actor": "trainer", "t": t, "kind": "staleness", "step": step, "alpha": 2,
                                 "counts": {"0": 100, "1": 20, "2": 8}}) + "\n")
            for state, dt in (("waiting", 0.05), ("training", 0.3), ("weight_sync", 0.02), ("logging", 0.01)):
                ev.write(json.dumps({"actor": "trainer", "state": state, "t0": round(t, 4), "t1": round(t + dt, 4),
                                     "step": step}) + "\n")
                t += dt
    sample = {"trainer_version": 0, "group_id": 0, "prompt_id": "p", "index": 0, "group_rewards": [1.0] * 8,
              "reward": 1.0, "version": 0, "finish_version": 0, "staleness": 0, "finish_reason": "stop",
              "reward_error": None, "prompt": "37+45=", "response": "82", "prompt_ids": [1] * 6,
              "response_ids": [2, 3, 4], "tokens": ["8", "2", "\n"], "loss_mask": [1, 1, 1], "logprobs": [-0.1] * 3}
    with (run / "samples.jsonl").open("w") as f:
        for i in range(5000):
            f.write(json.dumps({**sample, "step": steps - 625 + i // 8, "group_id": i // 8, "index": i % 8}) + "\n")
    (run / "summary.json").write_text(json.dumps({"steps": steps, "eval_before": {"pass_at_1": 0.66},
                                                  "eval_after": {"pass_at_1": 0.99}}))
    (run / "status.json").write_text(json.dumps({"state": "finished", "pid": 0, "host": "bench", "started": t,
                                                 "heartbeat": t, "ended": t, "step": steps}))


def make_runs(root: Path, runs: int, steps: int) -> int:
    write_run(root / "run-00", steps, 0)
    for i in range(1, runs):  # the same bytes: generating 50 x 20 MB of JSON would take minutes
        shutil.copytree(root / "run-00", root / f"run-{i:02d}")
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def timed_get(url: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    r = httpx.get(url, timeout=120)
    r.raise_for_status()
    return time.perf_counter() - t0, len(r.content)


def measure_api(base: str, run: str, repeats: int) -> dict:
    out = {}
    for name, path in [("runs", "/api/runs"), ("metrics", f"/api/runs/{run}/metrics"),
                       ("timeline", f"/api/runs/{run}/timeline"), ("samples", f"/api/runs/{run}/samples"),
                       ("details", f"/api/runs/{run}")]:
        cold, size = timed_get(base + path)
        warm = sorted(timed_get(base + path)[0] for _ in range(repeats))
        out[name] = {"cold_s": round(cold, 4), "warm_median_s": round(warm[len(warm) // 2], 4), "bytes": size}
    return out


def measure_browser(base: str, runs: int, run: str, repeats: int) -> dict:
    from playwright.sync_api import sync_playwright

    from cadence.dashboard.screenshot import CHROMIUM, CHROMIUM_ARGS

    list_s, charts_s = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        # The first visit starts with an empty browser cache; later ones reuse the context, as a
        # user reopening the page would (plotly.js then comes from the HTTP and V8 code caches).
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        for _ in range(repeats):
            page = context.new_page()
            t0 = time.perf_counter()
            page.goto(base + "/", wait_until="commit")  # from the request on, until the runs are listed
            page.wait_for_function(f"() => document.querySelectorAll('#runs-table tbody tr').length === {runs}",
                                   timeout=120_000)
            list_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            page.click(f'tr[data-run="{run}"]')
            page.wait_for_function("() => document.querySelectorAll('#charts .main-svg').length >= 9 && "
                                   "document.getElementById('chart-reward').data.length >= 3", timeout=120_000)
            charts_s.append(time.perf_counter() - t0)
            page.close()
        context.close()
        browser.close()
    return {"page_with_runs_list_s": [round(x, 3) for x in list_s], "open_run_charts_s": [round(x, 3) for x in charts_s]}


def load(runs: int, steps: int, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        t0 = time.perf_counter()
        size = make_runs(root, runs, steps)
        print(f"wrote {runs} runs x {steps} steps ({size / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f} s", flush=True)
        port = 8700 + os.getpid() % 200
        server = subprocess.Popen([sys.executable, "-m", "cadence.dashboard", "--runs", str(root), "--port", str(port)],
                                  stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    httpx.get(base + "/favicon.ico", timeout=1)
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            # Browser first: its first open of run-01 is the server's cold read of that run.
            browser = measure_browser(base, runs, "run-01", repeats)
            api = measure_api(base, "run-02", repeats)  # cold: a run nobody opened yet
        finally:
            server.terminate()
            server.wait(timeout=10)
    return {"runs": runs, "steps": steps, "bytes_on_disk": size, "browser": browser, "api": api}


# -- 2. overhead --------------------------------------------------------------------------------
def overhead(steps: int) -> dict:
    """The dashboard logging of one default step (16 groups x 8 answers) on the real writers,
    and a real run's step time with it on and off (alternated: A B A B)."""
    import torch

    torch.set_num_threads(1)
    from cadence.config import load_config
    from cadence.models.loading import load_tokenizer
    from cadence.observe.run_status import RunStatus
    from cadence.observe.run_trace import RunTrace
    from cadence.rollout.sample import Group, Sample

    cfg = load_config(None, [])
    tok = load_tokenizer(cfg.model.path)
    groups = [Group(g, f"p{g}", [Sample(f"p{g}", g, [5] * 6, [7, 8, 9, 202], [-0.1] * 4, 1.0, 0, "stop", "789")
                                 for _ in range(cfg.rollout.group_size)]) for g in range(cfg.rollout.prompts_per_step)]
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        trace = RunTrace(run, cfg.logging, tok, 0, RunStatus(run))
        n = 2000
        t0 = time.perf_counter()
        for step in range(1, n + 1):
            trace.waiting(step)
            trace.batch(step, step - 1, groups)
            trace.syncing(step)
            trace.stepped(step)
            trace.logged(step)
        per_step = (time.perf_counter() - t0) / n
        trace.close()
    from harness import train_run

    quick = ["logging.progress=false", "logging.tensorboard=false", "eval.before=false", "eval.after=false",
             "eval.every=0",
             "checkpoint.every=0", f"trainer.steps={steps}"]
    off = ["logging.events=false", "logging.samples_every=0"]
    times: dict[str, list[float]] = {"on": [], "off": []}
    for variant in ("on", "off", "on", "off"):
        run = train_run(quick + (off if variant == "off" else []))
        times[variant].append(sum(r["time/step"] for r in run.records[1:]) / max(1, len(run.records) - 1))
    on, off_ = sum(times["on"]) / 2, sum(times["off"]) / 2
    return {"trace_per_step_ms": round(1e3 * per_step, 3), "step_s_on": [round(x, 4) for x in times["on"]],
            "step_s_off": [round(x, 4) for x in times["off"]], "step_ratio_on_over_off": round(on / off_, 3),
            "trace_fraction_of_step": round(per_step / off_, 5), "train_steps": steps}


def doc_table(res: dict) -> str:
    load_, ov = res.get("load"), res.get("overhead")
    lines = []
    if load_:
        b, a = load_["browser"], load_["api"]
        med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
        lines += [f"{load_['runs']} runs x {load_['steps']} steps ({load_['bytes_on_disk'] / 1e9:.2f} GB of run "
                  f"folders), headless chromium on {res['cpu']}, load average {load_['loadavg'][0]:.1f} before / "
                  f"{load_['loadavg'][1]:.1f} after (the 2 cores were shared with other work):", "",
                  "| what | seconds |", "|---|---|",
                  f"| page open until the runs table lists all {load_['runs']} runs (empty browser cache / median of "
                  f"{len(b['page_with_runs_list_s'])}) | {b['page_with_runs_list_s'][0]:.2f} / "
                  f"{med(b['page_with_runs_list_s']):.2f} |",
                  "| open a run until its 9 charts are drawn (empty cache and the server's first read of the run / "
                  f"median) | {b['open_run_charts_s'][0]:.2f} / {med(b['open_run_charts_s']):.2f} |"]
        for name, r in a.items():
            lines.append(f"| GET {name} (first read / warm median, {r['bytes'] / 1e3:.0f} kB) | "
                         f"{r['cold_s']:.3f} / {r['warm_median_s']:.3f} |")
    if ov:
        fastest = min(ov["step_s_on"] + ov["step_s_off"])
        lines += ["", f"Dashboard logging per training step of the default config (16 x 8 samples, one group "
                  f"logged): {ov['trace_per_step_ms']:.2f} ms on the real writers, "
                  f"{100 * ov['trace_per_step_ms'] / 1e3 / fastest:.2f}% of the fastest step measured here "
                  f"({fastest:.2f} s). {ov['train_steps']}-step `cadence train` runs with it on and off, alternated "
                  f"(on, off, on, off), took {', '.join(f'{x:.2f}' for x in ov['step_s_on'])} s (on) and "
                  f"{', '.join(f'{x:.2f}' for x in ov['step_s_off'])} s (off) a step at load average "
                  f"{ov['loadavg'][0]:.1f} / {ov['loadavg'][1]:.1f}: the spread is the shared machine, far above "
                  "the logging's cost, so the logging is on by default."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--overhead-steps", type=int, default=12, help="steps of each train run")
    ap.add_argument("--part", choices=["load", "overhead", "both"], default="both",
                    help="run one part; the other keeps its numbers from the results file")
    ap.add_argument("--quick", action="store_true", help="5 runs x 1,000 steps, no overhead part, nothing written")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.steps, args.repeats, args.part = 5, 1000, 2, "load"
    res = json.loads(RESULTS.read_text()) if RESULTS.exists() and not args.quick else {}
    res["cpu"] = cpu_model()
    if args.part in ("load", "both"):
        before = os.getloadavg()[0]
        res["load"] = load(args.runs, args.steps, args.repeats)
        res["load"]["loadavg"] = [before, os.getloadavg()[0]]
        print(json.dumps(res["load"], indent=2), flush=True)
    if args.part in ("overhead", "both"):
        before = os.getloadavg()[0]
        res["overhead"] = overhead(args.overhead_steps)
        res["overhead"]["loadavg"] = [before, os.getloadavg()[0]]
        print(json.dumps(res["overhead"], indent=2), flush=True)
    if not args.quick:
        RESULTS.write_text(json.dumps(res, indent=2) + "\n")
        from cadence.observe.report import write_doc_table

        write_doc_table(DOC, "dashboard-load", doc_table(res))


if __name__ == "__main__":
    main()
