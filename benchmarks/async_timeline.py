"""Where the time of an async run goes, before and after a change: per-step timelines of paired runs.

    python benchmarks/compare_commits.py --before d5543f8 --after HEAD --rounds 12 \\
        --keep /tmp/pairs --out docs/results/x.json -- \\
        python '{after}/benchmarks/async_throughput.py' --no-generation-table \\
        --only "async alpha=2" --runs-dir '{run}'
    python benchmarks/async_timeline.py /tmp/pairs --variant async_alpha_2 \\
        --out docs/results/x_timeline.json --plot docs/results/x_timeline.png

Every kept run has the run's own metrics.jsonl and its pipeline timeline
(events/trainer.jsonl, events/rollout-0.jsonl: spans of waiting, training,
weight_sync, generating; see cadence/observe/events.py). For each timed step
(after `--warmup`) this reads the trainer's step split (waiting for the
batch, training, pushing weights), what the rollout worker did in the same
wall-clock span (generating, swapping weights, idle), the engine's steps and
busy seconds, the samples it finished and how stale the trained batch was.
Each number is the median over a run's timed steps, then the median over
runs; the paired column is the median of after / before within each round.
The plot draws one round's timeline of both versions, one lane per actor.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

# What each timed step reports; the keys name the columns of the table.
STEP_FIELDS = (
    "step_s", "train_s", "trainer_wait_s", "weight_push_s",
    "rollout_generating_s", "rollout_weight_sync_s", "rollout_idle_s",
    "engine_steps", "engine_busy_s", "engine_s_per_step_ms", "samples_finished", "samples_per_engine_step",
    "staleness_mean", "dropped_groups",
)


GROUPS_ENV = "ASYNC_BENCH_GROUP_TIMELINE"  # the folder the probe writes to, in every process of a run
# Seconds the probe holds back each weight push of the trainer (unset: none). It tests a cause:
# does a later push, with fewer rows left running at the swap, make the run faster?
PUSH_DELAY_ENV = "ASYNC_BENCH_PUSH_DELAY_S"
# Set: the answers a loop round finished are scored with the loop, and so the engine, waiting for
# them, as d5543f8 scored (today they are scored in the reward workers while the engine steps).
INLINE_SCORING_ENV = "ASYNC_BENCH_INLINE_SCORING"


def install_group_probe() -> None:
    """Log every engine step, weight swap, request and buffer move of this process to
    $ASYNC_BENCH_GROUP_TIMELINE/groups-<pid>.jsonl (nothing when it is unset).

    A benchmark probe, not a package feature: it wraps methods that both cadence
    versions compared here share (EmbeddedEngine, SampleBuffer; request ids are
    "<group id>/<answer>" in both), so the same probe times d5543f8 and today.
    One JSON line per engine step (~60 ms of work) or buffer call costs ~20 us.
    """
    import os
    import time

    from cadence.inference.embedded import EmbeddedEngine
    from cadence.rollout.buffer import SampleBuffer

    folder = os.environ.get(GROUPS_ENV)
    if not folder:
        return
    # The open file hangs on the class, not in this module, which Ray pickles by value.
    if getattr(EmbeddedEngine, "_probe_out", None):  # a later run in this process: methods wrapped already
        EmbeddedEngine._probe_out.close()
        EmbeddedEngine._probe_out = (Path(folder) / f"groups-{os.getpid()}.jsonl").open("a", buffering=1)
        return
    EmbeddedEngine._probe_out = (Path(folder) / f"groups-{os.getpid()}.jsonl").open("a", buffering=1)

    def log(**record: object) -> None:
        EmbeddedEngine._probe_out.write(json.dumps(record, separators=(",", ":")) + "\n")

    # The process's garbage-collection seconds so far (its collections pause every thread): a step
    # logs the collections that ran inside it.
    import gc

    gc_s, gc_start = [0.0], [0.0]

    def gc_clock(phase: str, info: dict) -> None:
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            gc_s[0] += time.perf_counter() - gc_start[0]

    gc.callbacks.append(gc_clock)

    def wrap(cls: type, name: str, before, after) -> None:
        original = getattr(cls, name)

        def probed(self, *args, **kwargs):
            seen, t0 = before(self, *args), time.time()
            result = original(self, *args, **kwargs)
            after(self, seen, t0, result, *args)
            return result

        setattr(cls, name, probed)

    wrap(EmbeddedEngine, "add_request", lambda e, req: None,
         lambda e, _, t0, r, req: log(e="add", t=t0, id=req.request_id))
    # cpu: the thread's CPU seconds in the call; against t1 - t0 it separates work from waiting for a core.
    wrap(EmbeddedEngine, "step", lambda e: (len(e._running), len(e._waiting), time.thread_time(), gc_s[0]),
         lambda e, seen, t0, done: log(e="step", t0=t0, t1=time.time(), cpu=time.thread_time() - seen[2],
                                       gc=round(gc_s[0] - seen[3], 6), running=seen[0], waiting=seen[1],
                                       done=[r.request_id for r in done]))
    # rows, tokens: the running rows and their total length (prompt + generated) at the swap, the
    # prefill the swap's cache recompute does.
    wrap(EmbeddedEngine, "update_weights",
         lambda e, sd, version: (time.thread_time(), len(e._running),
                                 sum(len(s.req.prompt_ids) + len(s.tokens) for s in e._running)),
         lambda e, seen, t0, r, sd, version: log(e="swap", t0=t0, t1=time.time(), cpu=time.thread_time() - seen[0],
                                                 version=version, rows=seen[1], tokens=seen[2]))
    wrap(SampleBuffer, "put", lambda b, g: None,
         lambda b, _, t0, r, g: log(e="put", t=t0, group=g.group_id, version=g.version))
    wrap(SampleBuffer, "evict_stale", lambda b, v: [g.group_id for g in b._groups],
         lambda b, seen, t0, n, v: n and log(e="stale", t=t0, trainer_version=v,
                                             groups=sorted(set(seen) - {g.group_id for g in b._groups})))
    if os.environ.get(INLINE_SCORING_ENV):  # an experiment: score with the loop (and the engine) waiting
        from cadence.rollout.rlvr import GuardScorer

        def score_inline(scorer: GuardScorer, loop: object) -> None:
            batch, scorer._batch = scorer._batch, []
            outcomes = scorer.guard.score([(p, r) for p, r, _ in batch])
            for (_, _, future), outcome in zip(batch, outcomes, strict=True):
                if not future.done():
                    future.set_result(outcome)

        GuardScorer._send = score_inline
    delay = float(os.environ.get(PUSH_DELAY_ENV) or 0)
    if delay > 0:  # an experiment, not a measurement: the trainer's push held back (results.md, session 17)
        from cadence.runtime.placement import WorkerGroup

        wrap(WorkerGroup, "update_weights", lambda g, sd, version: time.sleep(delay),
             lambda g, _, t0, r, sd, version: log(e="push", t=t0, version=version, delay_s=delay))
    wrap(SampleBuffer, "get_batch", lambda b, *a: None,
         lambda b, _, t0, batch, n, v: log(e="batch", t=time.time(), trainer_version=v,
                                           groups=[g.group_id for g in batch]))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def overlap(spans: list[dict], state: str, t0: float, t1: float) -> float:
    """Seconds the actor spent in `state` between t0 and t1."""
    return sum(max(0.0, min(s["t1"], t1) - max(s["t0"], t0)) for s in spans if s.get("state") == state)


def run_steps(run: Path, warmup: int) -> list[dict]:
    """The timed steps of one kept run, each as STEP_FIELDS."""
    records = [r for r in read_jsonl(run / "metrics.jsonl") if "time/step" in r]
    trainer = read_jsonl(run / "events" / "trainer.jsonl")
    rollout = read_jsonl(run / "events" / "rollout-0.jsonl")
    # A trainer step runs from its `waiting` span's start to its `logging` span's end.
    bounds: dict[int, list[float]] = {}
    for s in trainer:
        if "state" in s:
            b = bounds.setdefault(s["step"], [s["t0"], s["t1"]])
            b[0], b[1] = min(b[0], s["t0"]), max(b[1], s["t1"])
    steps = []
    for prev, r in zip(records, records[1:], strict=False):
        if r["step"] <= warmup or r["step"] not in bounds:
            continue
        t0, t1 = bounds[r["step"]]
        mine = [s for s in trainer if s.get("step") == r["step"]]
        engine_steps = r["rollout/engine_steps"] - prev["rollout/engine_steps"]
        busy = r["rollout/engine_busy_s"] - prev["rollout/engine_busy_s"]
        samples = r["rollout/samples_total"] - prev["rollout/samples_total"]
        steps.append({
            "step": r["step"], "t0": t0, "t1": t1,
            "step_s": r["time/step"], "train_s": r["train/seconds"],
            "trainer_wait_s": overlap(mine, "waiting", t0, t1),
            "weight_push_s": overlap(mine, "weight_sync", t0, t1),
            "rollout_generating_s": overlap(rollout, "generating", t0, t1),
            "rollout_weight_sync_s": overlap(rollout, "weight_sync", t0, t1),
            "rollout_idle_s": overlap(rollout, "waiting", t0, t1),
            "engine_steps": engine_steps, "engine_busy_s": busy,
            "engine_s_per_step_ms": 1e3 * busy / max(engine_steps, 1),
            "samples_finished": samples, "samples_per_engine_step": samples / max(engine_steps, 1),
            "staleness_mean": r["train/staleness_mean"],
            "dropped_groups": r["buffer/dropped_groups"] - prev["buffer/dropped_groups"],
        })
    return steps


# What the probe's log says about the same timed span (run_groups); absent when no probe ran.
GROUP_FIELDS = (
    "engine_step_share", "engine_swap_share", "engine_gap_share", "engine_rows_mean", "engine_waiting_mean",
    "swaps", "swap_s", "push_to_swap_s", "answer_to_buffer_ms", "group_add_to_buffer_s",
    "engine_cpu_per_step_ms", "engine_cpu_share", "swap_cpu_s", "engine_cpu_ms_per_sample",
    "swap_rows", "swap_tokens", "swap_cpu_ms_per_1k_tokens",
    "queue_empty_s", "drain_s", "drain_steps", "step_cpu_ms_under_8_rows", "step_cpu_ms_56_to_63_rows",
    "step_gc_ms_mean",
)


def run_groups(run: Path, t0: float, t1: float) -> dict[str, float]:
    """The rollout process's engine, swaps and groups between t0 and t1 (the timed steps)."""
    log = [r for f in sorted((run / "events").glob("groups-*.jsonl")) for r in read_jsonl(f)]
    steps = [r for r in log if r["e"] == "step" and t0 <= r["t0"] < t1]
    swaps = [r for r in log if r["e"] == "swap" and t0 <= r["t0"] < t1]
    if not steps:
        return {}
    span = t1 - t0
    step_s = sum(min(r["t1"], t1) - r["t0"] for r in steps)
    swap_s = sum(min(r["t1"], t1) - r["t0"] for r in swaps)
    # The trainer's pushes: the end of each of its weight_sync spans; each swap follows the latest one.
    pushes = sorted(s["t1"] for s in read_jsonl(run / "events" / "trainer.jsonl") if s.get("state") == "weight_sync")
    delays = [w["t0"] - max((p for p in pushes if p <= w["t0"]), default=w["t0"]) for w in swaps]
    added, answered = {}, {}
    for r in log:
        if r["e"] == "add":
            added.setdefault(r["id"].split("/")[0], r["t"])
        elif r["e"] == "step":
            for rid in r["done"]:
                answered[rid.split("/")[0]] = r["t1"]  # the group's last answer so far
    puts = [r for r in log if r["e"] == "put" and t0 <= r["t"] < t1]
    to_buffer = [r["t"] - answered[str(r["group"])] for r in puts if str(r["group"]) in answered]
    add_to_buffer = [r["t"] - added[str(r["group"])] for r in puts if str(r["group"]) in added]
    return {
        "engine_step_share": step_s / span, "engine_swap_share": swap_s / span,
        "engine_gap_share": 1 - (step_s + swap_s) / span,
        "engine_rows_mean": sum(r["running"] * (r["t1"] - r["t0"]) for r in steps) / step_s,
        "engine_waiting_mean": sum(r["waiting"] * (r["t1"] - r["t0"]) for r in steps) / step_s,
        "swaps": len(swaps), "swap_s": swap_s / max(len(swaps), 1),
        "push_to_swap_s": statistics.median(delays) if delays else float("nan"),
        "answer_to_buffer_ms": 1e3 * statistics.median(to_buffer) if to_buffer else float("nan"),
        "group_add_to_buffer_s": statistics.median(add_to_buffer) if add_to_buffer else float("nan"),
        **(cpu_fields(steps, swaps, step_s) if all("cpu" in r for r in steps + swaps) else {}),
        **(swap_fields(swaps) if swaps and all("tokens" in r for r in swaps) else {}),
        **cycle_fields(steps, swaps),
    }


def cycle_fields(steps: list[dict], swaps: list[dict]) -> dict[str, float]:
    """Each cycle from one swap to the next: how long the engine took to give every queued request
    a slot (queue_empty_s, from the swap's end), then how long and how many steps it ran on the
    rows left (the drain, up to the next swap, whose rows it recomputes); and the CPU of one engine
    step at nearly the same batch (few rows, a full one), which the number of rows does not explain."""
    cycles = []
    for a, b in zip(swaps, swaps[1:], strict=False):
        inside = [r for r in steps if a["t1"] <= r["t0"] and r["t1"] <= b["t0"]]
        dry = next((r for r in inside if r["waiting"] == 0), None)
        if dry is not None:
            cycles.append((dry["t0"] - a["t1"], b["t0"] - dry["t0"], sum(r["t0"] >= dry["t0"] for r in inside)))
    out = {}
    if cycles:
        out.update({"queue_empty_s": statistics.median(c[0] for c in cycles),
                    "drain_s": statistics.median(c[1] for c in cycles),
                    "drain_steps": statistics.median(c[2] for c in cycles)})
    if steps and all("gc" in r for r in steps):  # a probe that logs collections
        out["step_gc_ms_mean"] = 1e3 * statistics.fmean(r["gc"] for r in steps)
    for name, low, high in (("step_cpu_ms_under_8_rows", 0, 8), ("step_cpu_ms_56_to_63_rows", 56, 64)):
        cpu = [r["cpu"] for r in steps if "cpu" in r and low <= r["running"] < high]
        if cpu:
            out[name] = 1e3 * statistics.median(cpu)
    return out


def swap_fields(swaps: list[dict]) -> dict[str, float]:
    """What a swap recomputes: the running rows and their total length (a prefill of all of them),
    and the swap's CPU per 1k of those tokens (its cost with the length taken out)."""
    tokens = sum(r["tokens"] for r in swaps)
    return {"swap_rows": statistics.median(r["rows"] for r in swaps),
            "swap_tokens": statistics.median(r["tokens"] for r in swaps),
            "swap_cpu_ms_per_1k_tokens": 1e6 * sum(r["cpu"] for r in swaps) / max(tokens, 1)}


def cpu_fields(steps: list[dict], swaps: list[dict], step_s: float) -> dict[str, float]:
    """The engine thread's CPU seconds: its work, whatever the machine's load made it wait for a core.
    engine_cpu_ms_per_sample (steps and swaps over the answers finished) is the load-free cost of a sample."""
    cpu_steps, cpu_swaps = sum(r["cpu"] for r in steps), sum(r["cpu"] for r in swaps)
    answers = sum(len(r["done"]) for r in steps)
    return {"engine_cpu_per_step_ms": 1e3 * cpu_steps / len(steps), "engine_cpu_share": cpu_steps / step_s,
            "swap_cpu_s": cpu_swaps / max(len(swaps), 1),
            "engine_cpu_ms_per_sample": 1e3 * (cpu_steps + cpu_swaps) / max(answers, 1)}


def per_run(run: Path, warmup: int) -> dict[str, float]:
    steps = run_steps(run, warmup)
    return {**{k: statistics.median(s[k] for s in steps) for k in STEP_FIELDS},
            **run_groups(run, steps[0]["t0"], steps[-1]["t1"])}


def summarize(pairs: list[tuple[Path, Path]], warmup: int) -> dict:
    runs = {"before": [per_run(b, warmup) for b, _ in pairs], "after": [per_run(a, warmup) for _, a in pairs]}
    table = []
    for k in (*STEP_FIELDS, *(f for f in GROUP_FIELDS if all(f in r for r in runs["before"] + runs["after"]))):
        b = statistics.median(r[k] for r in runs["before"])
        a = statistics.median(r[k] for r in runs["after"])
        ratios = [ra[k] / rb[k] for rb, ra in zip(runs["before"], runs["after"], strict=True) if rb[k]]
        table.append({"field": k, "before": b, "after": a,
                      "median_paired_ratio": statistics.median(ratios) if ratios else None})
    return {"rounds": len(pairs), "warmup": warmup, "table": table, "runs": runs}


def plot_round(before: Path, after: Path, warmup: int, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"waiting": "#d9d9d9", "training": "#4c72b0", "weight_sync": "#c44e52", "logging": "#8172b2",
               "generating": "#55a868", "other (checkpoint, evaluation)": "#444444"}
    fig, axes = plt.subplots(2, 1, figsize=(12, 5), sharex=True)
    longest = 0.0
    for ax, (name, run) in zip(axes, (("before", before), ("after", after)), strict=True):
        steps = run_steps(run, warmup)
        start, end = steps[0]["t0"], steps[-1]["t1"]
        lanes = {"trainer": read_jsonl(run / "events" / "trainer.jsonl"),
                 "rollout": read_jsonl(run / "events" / "rollout-0.jsonl"),
                 "engine (probe)": [{"state": {"step": "generating", "swap": "weight_sync"}[r["e"]], **r}
                                    for f in sorted((run / "events").glob("groups-*.jsonl"))
                                    for r in read_jsonl(f) if r["e"] in ("step", "swap")]}
        for lane, spans in enumerate(lanes.values()):
            for s in spans:
                if "state" in s and s["t1"] > start and s["t0"] < end:
                    left, right = max(s["t0"], start) - start, min(s["t1"], end) - start
                    ax.barh(lane, right - left, left=left, color=colours.get(s["state"], "#444444"), height=0.8)
        for s in steps:
            ax.axvline(s["t1"] - start, color="k", lw=0.5)
        ax.set_yticks(range(len(lanes)), list(lanes))
        longest = max(longest, end - start)
        ax.set_title(f"{name}: {len(steps)} timed steps, {end - start:.1f} s", fontsize=9, loc="left")
    axes[-1].set_xlim(0, longest)
    axes[-1].set_xlabel("seconds from the first timed step (vertical lines: a trainer step ends)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    fig.legend(handles, list(colours), loc="upper right", ncols=5, fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("keep", type=Path, help="compare_commits.py's --keep folder (NN_before/, NN_after/)")
    ap.add_argument("--variant", default="async_alpha_2", help="the variant's folder in each run")
    ap.add_argument("--warmup", type=int, default=2, help="steps not timed (as the benchmark's --warmup)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--plot", type=Path, default=None, help="draw the round whose step time ratio is the median")
    args = ap.parse_args()
    rounds = sorted({p.name.split("_")[0] for p in args.keep.iterdir()})
    pairs = [(args.keep / f"{r}_before" / args.variant, args.keep / f"{r}_after" / args.variant) for r in rounds]
    pairs = [(b, a) for b, a in pairs if (b / "metrics.jsonl").exists() and (a / "metrics.jsonl").exists()]
    if not pairs:
        raise SystemExit(f"{args.keep}: no round with both a before and an after run of {args.variant}")
    result = summarize(pairs, args.warmup)
    print(f"{'per timed step (median)':28s} {'before':>9s} {'after':>9s} {'paired after/before':>20s}")
    for row in result["table"]:
        ratio = f"{row['median_paired_ratio']:.3f}" if row["median_paired_ratio"] is not None else "-"
        print(f"{row['field']:28s} {row['before']:9.3f} {row['after']:9.3f} {ratio:>20s}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    if args.plot:
        ratios = [a["step_s"] / b["step_s"] for b, a in zip(result["runs"]["before"], result["runs"]["after"],
                                                             strict=True)]
        middle = sorted(range(len(ratios)), key=ratios.__getitem__)[len(ratios) // 2]
        plot_round(*pairs[middle], args.warmup, args.plot)


if __name__ == "__main__":
    main()
