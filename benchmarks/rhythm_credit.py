"""Benchmark: GRPO vs GRPO + attention-rhythm credit (local, global, coupled).

Issue 7 asks, on the embedded default task, for the same steps and three seeds
of GRPO and of GRPO with each of the three credits, reporting final held-out
accuracy and the cost of the attention pass. This script runs all of them in
one process, one after the other (the benchmark machine has two cores, and
parallel runs would distort every timing), and writes

- ``docs/results/rhythm_credit.json``: every run and the per-method summary;
- the table between the ``rhythm-table`` markers of ``docs/attention_rhythm.md``
  (a rerun replaces it);
- ``docs/results/rhythm_example*.png``: the ``cadence rhythm`` pictures.

Two settings:

``default``
    ``cadence train`` as shipped: the built-in model on 2-digit addition. Its
    responses are 2-4 tokens ("85\\n"), shorter than the FAI horizon
    (t - s >= 10), so FAI is 0 everywhere, no token is an anchor, and global
    and coupled credit leave every advantage unchanged (gamma = 1). They are
    run anyway: they measure the attention pass's cost, and reproducing
    GRPO's reward curve exactly is the check that they are inert.
``scratchpad``
    Where the attention structure has room to matter: the built-in model is
    first fine-tuned (a few minutes, cached under ``--workdir``) to write its
    column sums before the answer, ``47+38=`` -> ``7+8=15, 4+3+1=8, so 85\\n``
    (~23 tokens). Like the built-in model's own warm-up, 60% of the SFT
    answers to carrying problems forget to add the carry (``4+3+0=7, so 75``),
    a habit RL with the exact-match reward (on the last number) removes. The
    answer digits are copied from column sums 5-20 tokens back, so FAI is
    non-zero and all three credits act.

Usage::

    python benchmarks/rhythm_credit.py                 # the documented table
    python benchmarks/rhythm_credit.py --quick         # smoke test, writes nothing under docs/
    python benchmarks/rhythm_credit.py --steps 60 --seeds 0 1 2 3 --settings scratchpad
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from cadence.algo.rhythm import RhythmConfig
from cadence.config import load_config
from cadence.recipes.train_rlvr import train

# The scratchpad setting lives beside this script; running it as a script or loading it
# from a file path (the tests) both find it.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import cpu_model  # noqa: E402
from rhythm_credit_report import (  # noqa: E402, F401 (TABLE_*: re-exported for the tests)
    TABLE_END,
    TABLE_START,
    markdown_table,
    or_dash,
    percent,
    write_table,
)
from scratchpad_setting import (  # noqa: E402, F401 (SCRATCHPAD_TEST: re-exported for the tests)
    SCRATCHPAD_TEST,
    SFT_STEPS,
    prepare_scratchpad,
    scratchpad,
    scratchpad_split,
)

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "attention_rhythm.md"
RESULTS = REPO / "docs" / "results"

METHODS = ("none", "local", "global", "coupled")
LABELS = {
    "none": "GRPO",
    "local": "GRPO + local",
    "global": "GRPO + global",
    "coupled": "GRPO + coupled",
}
SETTINGS = ("default", "scratchpad")

# Common to every run: quiet, no intermediate checkpoints, one torch thread.
BASE_OVERRIDES = [
    "logging.progress=false",
    "logging.tensorboard=false",
    "checkpoint.every=0",
    "runtime.threads=1",
]

# ----------------------------------------------------------------------------
# Runs


@dataclass
class RunRecord:
    """One training run, reduced to what the table needs (all times in seconds)."""

    setting: str
    method: str
    seed: int
    steps: int
    pass_before: float
    pass_after: float
    step_s: float  # mean time/step: rollout + trainer step (incl. attention pass) + weight sync
    train_s: float  # mean train/seconds: the trainer step alone
    rollout_s: float  # mean time/rollout
    attention_s: float  # mean rhythm/attention_seconds (0 for GRPO)
    attention_share: float  # sum attention_seconds / sum time/step
    amplified_frac: float | None
    gamma_mean: float | None
    response_len: float
    wall_s: float  # the whole run in this process: load, eval before, train, eval after
    load_avg: float  # 1-minute load average when the run ended: the machine is shared
    reward_curve: list[float] = field(repr=False)
    grad_norm_curve: list[float] = field(repr=False)


def _mean(records: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in records if key in r]
    return statistics.fmean(values) if values else None


def run_one(
    setting: str, method: str, seed: int, steps: int, overrides: list[str], workdir: Path
) -> RunRecord:
    """Train once and read the run's metrics.jsonl back."""
    run_dir = workdir / "runs" / f"{setting}-{method}-seed{seed}-{time.time_ns()}"
    cfg = load_config(
        None,
        [
            *BASE_OVERRIDES,
            *overrides,
            f"algorithm.credit={method}",
            f"trainer.steps={steps}",
            f"seed={seed}",
            f"logging.run_dir={run_dir}",
        ],
    )
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # train() prints a summary box per run
        summary = train(cfg)
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in (summary.run_dir / "metrics.jsonl").open()]
    rows = [r for r in rows if "time/step" in r]  # step 0 holds the evaluation before training
    step_total = sum(r["time/step"] for r in rows)
    attention_total = sum(r.get("rhythm/attention_seconds", 0.0) for r in rows)
    return RunRecord(
        setting=setting,
        method=method,
        seed=seed,
        steps=steps,
        pass_before=summary.eval_before.pass_at_1,
        pass_after=summary.eval_after.pass_at_1,
        step_s=step_total / len(rows),
        train_s=_mean(rows, "train/seconds") or 0.0,
        rollout_s=_mean(rows, "time/rollout") or 0.0,
        attention_s=attention_total / len(rows),
        attention_share=attention_total / step_total,
        amplified_frac=_mean(rows, "rhythm/amplified_frac"),
        gamma_mean=_mean(rows, "rhythm/gamma_mean"),
        response_len=_mean(rows, "response/length_mean") or 0.0,
        wall_s=wall,
        load_avg=os.getloadavg()[0],
        reward_curve=[r["reward/mean"] for r in rows],
        grad_norm_curve=[r["train/grad_norm"] for r in rows],
    )


def summarise(runs: list[RunRecord]) -> list[dict[str, Any]]:
    """Per (setting, method): accuracy over seeds and mean costs, step time relative to GRPO."""
    out = []
    for setting in dict.fromkeys(r.setting for r in runs):
        mine = [r for r in runs if r.setting == setting]
        grpo = {r.seed: r for r in mine if r.method == "none"}
        grpo_step = statistics.fmean(r.step_s for r in grpo.values()) if grpo else None
        for method in METHODS:
            group = [r for r in mine if r.method == method]
            if not group:
                continue
            after = [r.pass_after for r in group]
            step = statistics.fmean(r.step_s for r in group)
            gammas = [r.gamma_mean for r in group if r.gamma_mean is not None]
            fracs = [r.amplified_frac for r in group if r.amplified_frac is not None]
            out.append(
                {
                    "setting": setting,
                    "method": method,
                    "label": LABELS[method],
                    "seeds": [r.seed for r in group],
                    "pass_before": statistics.fmean(r.pass_before for r in group),
                    "pass_after": after,
                    "pass_after_mean": statistics.fmean(after),
                    "pass_after_sd": statistics.stdev(after) if len(after) > 1 else 0.0,
                    "step_s": step,
                    "train_s": statistics.fmean(r.train_s for r in group),
                    "rollout_s": statistics.fmean(r.rollout_s for r in group),
                    "attention_s": statistics.fmean(r.attention_s for r in group),
                    "attention_share": sum(r.attention_s for r in group)
                    / sum(r.step_s for r in group),
                    "step_vs_grpo": step / grpo_step if grpo_step else None,
                    "amplified_frac": statistics.fmean(fracs) if fracs else None,
                    "gamma_mean": statistics.fmean(gammas) if gammas else None,
                    "response_len": statistics.fmean(r.response_len for r in group),
                    # Same seed, same reward and gradient norm at every step: the
                    # credit changed no advantage, so the run is GRPO's run.
                    "identical_to_grpo": all(
                        r.seed in grpo
                        and r.reward_curve == grpo[r.seed].reward_curve
                        and r.grad_norm_curve == grpo[r.seed].grad_norm_curve
                        for r in group
                    )
                    if method != "none"
                    else None,
                }
            )
    return out


# ----------------------------------------------------------------------------
# Where the attention pass's time goes


def probe_attention(
    model: str, prompt: str, response_len: int, batch: int, repeats: int = 3
) -> list[dict[str, Any]]:
    """Time the attention pass on one synthetic batch: model forward vs the batched credit math.

    Tries the cheaper knobs: fewer layers (`algorithm.rhythm.layers`) and the
    forward's micro-batch (`algorithm.rhythm.micro_batch`, 128 by default).
    Response tokens are random: the cost does not depend on what they say.
    """
    from cadence.models.attention import ActorAttention
    from cadence.models.loading import load_policy, load_tokenizer

    tokenizer, policy = load_tokenizer(model), load_policy(model)
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor(tokenizer(prompt).input_ids)
    prompts = [p] * batch
    responses = [torch.randint(4, 200, (response_len,), generator=gen) for _ in range(batch)]
    ids = torch.cat([torch.stack(prompts), torch.stack(responses)], dim=1)
    cfg = RhythmConfig()
    rows = []
    for layers in (cfg.layers, 1):
        actor = ActorAttention(policy, layers=layers)
        for micro in (16, batch):
            total, forward = math.inf, math.inf
            for _ in range(repeats):  # best of several: the machine is shared
                t0 = time.perf_counter()
                actor.token_credit_batch(prompts, responses, "coupled", cfg, micro_batch=micro)
                t1 = time.perf_counter()
                for lo in range(0, batch, micro):
                    actor.maps(ids[lo : lo + micro], query_start=p.numel())
                t2 = time.perf_counter()
                total, forward = min(total, t1 - t0), min(forward, t2 - t1)
            rows.append(
                {
                    "layers_config": layers,
                    "layers_read": list(actor.layer_ids),
                    "micro_batch": micro,
                    "batch": batch,
                    "response_len": response_len,
                    "total_s": total,
                    "forward_s": forward,
                    "credit_math_s": max(0.0, total - forward),
                }
            )
    return rows


def carry_credit(model: str, problems: int = 60) -> dict[str, Any]:
    """Does each credit reach the token that decides a carrying problem?

    In the scratchpad the answer hinges on one token: the carry digit of the
    tens column ("4+3+1" right, "4+3+0" the slip), about 12 tokens into a
    ~24-token response. This reads both workings, right and slipped, of the
    first `problems` carrying test problems (teacher-forced, so every sample
    has the token at a known place) and reports, per credit, how often that
    token is amplified and its mean gamma, plus how large the FAI of the
    selected anchors is: top-q keeps ceil(q * R) tokens whatever their FAI.
    """
    from cadence.models.attention import ActorAttention
    from cadence.models.loading import load_policy, load_tokenizer

    tokenizer = load_tokenizer(model)
    actor = ActorAttention(load_policy(model))
    _, test = scratchpad_split()
    prompts, responses, where = [], [], []
    for a, b in [(a, b) for a, b in test if a % 10 + b % 10 >= 10][:problems]:
        for slip in (False, True):
            text = scratchpad(a, b, slip)
            tens = text.index(", ") + 2  # "a1+b1+c=..." starts here; c is its 5th character
            prompts.append(torch.tensor(tokenizer(f"{a:02d}+{b:02d}=").input_ids))
            responses.append(torch.tensor(tokenizer(text, add_special_tokens=False).input_ids))
            where.append(tens + 4)  # one token per character
    out: dict[str, Any] = {
        "responses": len(responses),
        "carry_position_mean": statistics.fmean(where),
        "response_len_mean": statistics.fmean(r.numel() for r in responses),
    }
    for credit in ("local", "global", "coupled"):
        results = actor.token_credit_batch(
            prompts, responses, credit, RhythmConfig(), micro_batch=16
        )
        gammas = [float(g[i]) for (g, _), i in zip(results, where, strict=True)]
        out[credit] = {
            "carry_amplified": statistics.fmean(g > 1.0 for g in gammas),
            "carry_gamma_mean": statistics.fmean(gammas),
        }
        if credit == "global":
            fai = [
                float(info["fai"][a])
                for _, info in results
                for a in info["anchors"].nonzero().flatten()
            ]
            out["anchor_fai_median"] = statistics.median(fai)
            out["anchor_fai_below_1e-4"] = statistics.fmean(f < 1e-4 for f in fai)
    return out


# ----------------------------------------------------------------------------
# Pictures


def draw_examples(scratchpad_model: str | None) -> list[str]:
    """The `cadence rhythm` pictures embedded in the docs; returns their paths."""
    from cadence.recipes.rhythm import run_rhythm

    made = []
    jobs = [("builtin", RESULTS / "rhythm_example_builtin.png")]
    if scratchpad_model:
        jobs.insert(0, (scratchpad_model, RESULTS / "rhythm_example.png"))
    for checkpoint, out in jobs:
        result = run_rhythm(
            checkpoint, prompt="47+38=", credit="coupled", stop=["\n"], out=out, threads=1
        )
        print(f"  {out.relative_to(REPO)}: {result.summary()}")
        made.append(str(out.relative_to(REPO)))
    return made


# ----------------------------------------------------------------------------
# Main


def machine() -> str:
    """CPU model and core count, Python and torch versions: timings mean little without them."""
    cpu = cpu_model()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"{cpu}, {cores} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="Training steps of every run.")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument(
        "--sft-steps", type=int, default=SFT_STEPS, help="Scratchpad warm-up steps."
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=REPO / "runs" / "bench-rhythm",
        help="Run folders, scratchpad data and the warmed-up model (reused between invocations).",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="Smoke test: 2 steps, seed 0, a 20-step warm-up, results under --workdir only.",
    )
    parser.add_argument("--no-docs", action="store_true", help="Write nothing under docs/.")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.seeds, args.sft_steps, args.no_docs = 2, [0], 20, True
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    began = time.perf_counter()
    torch.set_num_threads(1)
    args.workdir.mkdir(parents=True, exist_ok=True)
    settings: dict[str, dict[str, Any]] = {}
    overrides: dict[str, list[str]] = {}
    if "default" in args.settings:
        cfg = load_config(None, [])
        overrides["default"] = []
        settings["default"] = {
            "what": "`cadence train` defaults: built-in model, 2-digit addition (`task.name=arith`)",
            "batch": cfg.batch_size,
            "overrides": [],
        }
    if "scratchpad" in args.settings:
        extra, facts = prepare_scratchpad(args.workdir, args.sft_steps)
        overrides["scratchpad"] = extra
        cfg = load_config(None, extra)
        settings["scratchpad"] = {
            "what": "built-in model fine-tuned to write its column sums "
            "(`47+38=` -> `7+8=15, 4+3+1=8, so 85`), with a carry-slip habit",
            "batch": cfg.batch_size,
            "overrides": extra,
            **facts,
        }

    runs: list[RunRecord] = []
    total = len(settings) * len(args.seeds) * len(args.methods)
    for setting in settings:
        # Seeds outside, methods inside: a slow spell on the shared machine then
        # hits every method of a seed alike instead of one method's three runs.
        for seed in args.seeds:
            for method in args.methods:
                record = run_one(
                    setting, method, seed, args.steps, overrides[setting], args.workdir
                )
                runs.append(record)
                print(
                    f"[{len(runs)}/{total}] {setting:<10} {LABELS[method]:<15} seed {seed}: "
                    f"pass@1 {record.pass_before:.3f} -> {record.pass_after:.3f}, "
                    f"step {record.step_s:.3f} s, attention {record.attention_s:.3f} s "
                    f"({percent(record.attention_share)}%), gamma {or_dash(record.gamma_mean, '.3f')}, "
                    f"run {record.wall_s:.0f} s, load {record.load_avg:.1f}",
                    flush=True,
                )

    probes = {}
    for setting in settings:
        model = settings[setting].get("model", "builtin")
        length = round(statistics.fmean(r.response_len for r in runs if r.setting == setting))
        probes[setting] = probe_attention(
            model, "47+38=", length, settings[setting]["batch"], repeats=1 if args.quick else 3
        )

    carry = None
    if "scratchpad" in settings:
        carry = carry_credit(settings["scratchpad"]["model"], problems=10 if args.quick else 60)

    summary = summarise(runs)
    command = "python benchmarks/rhythm_credit.py" + (" " + " ".join(argv) if argv else "")
    meta = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": machine(),
        "steps": args.steps,
        "seeds": args.seeds,
        "command": command,
        "settings": settings,
        "attention_probe": probes,
        "carry_credit": carry,
        "load_avg_max": max(r.load_avg for r in runs),
    }
    pictures = [] if args.no_docs else draw_examples(settings.get("scratchpad", {}).get("model"))
    meta["wall_s"] = time.perf_counter() - began
    meta["pictures"] = pictures
    table = markdown_table(summary, meta)
    report = {"meta": meta, "summary": summary, "runs": [asdict(r) for r in runs]}
    out_json = (
        args.workdir / "rhythm_credit.json" if args.no_docs else RESULTS / "rhythm_credit.json"
    )
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if not args.no_docs:
        write_table(DOC, table)
    print()
    print(table)
    print(f"wrote {out_json}" + ("" if args.no_docs else f" and the table in {DOC}"))
    print(f"benchmark wall time: {meta['wall_s']:.0f} s")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
