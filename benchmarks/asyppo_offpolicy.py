"""AsyPPO at off-policy ratio 8: why it collapses on the carry task, and what makes it hold (issue 27).

    python benchmarks/asyppo_offpolicy.py                       # the documented table (3 seeds)
    python benchmarks/asyppo_offpolicy.py --variants "weight, no entropy bonus" --seeds 0 --out /tmp/a.json

The setting is benchmarks/offpolicy_stability.py's (`overrides`): the carry
task, 60 steps, lr 3e-4, 8 prompts x 8 answers, inline runtime, alpha versions
of staleness allowed. Every variant is `algorithm.name=asyppo` with one switch.
Beside the held-out curve (every 5 steps) each run keeps per-step diagnostics:
the critics' explained variance and signed error, the GAE advantages' mean, std
and share of positive tokens, the share of tokens AsyPPO's masks drop, the
policy's entropy, ratio and ESS statistics, staleness, training reward.

The GAE advantage statistics come from wrapping `CriticEnsemble.update`, which
receives the GAE returns and the critics' values (A = returns - V), so the
library itself is not changed to measure them.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import cpu_model, train_run  # noqa: E402
from offpolicy_stability import SETTING, overrides, write_carry_task  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results" / "asyppo_offpolicy.json"
DATA = ROOT / "runs" / "offpolicy-carry"
ASYPPO = ["algorithm.name=asyppo"]
# name -> (alpha, overrides on top of algorithm.name=asyppo)
VARIANTS: dict[str, tuple[int, list[str]]] = {
    "sync (alpha 0), pi_old/mu weight": (0, []),
    "no correction": (8, ["algorithm.mismatch.mode=none"]),
    "pi_old/mu weight (default)": (8, []),
    "weight, no entropy bonus": (8, ["algorithm.entropy_coef=0"]),
    "weight, no masks": (8, ["algorithm.critic.adv_mask_low=0", "algorithm.critic.entropy_mask_high=0"]),
    "weight, whitened advantages": (8, ["algorithm.whiten_advantages=true"]),
    "weight, critic_lr 1e-3": (8, ["algorithm.critic.critic_lr=1e-3"]),
    "weight, lr 1e-4": (8, ["trainer.lr=1e-4"]),
    "topr loss": (8, ["algorithm.loss=topr"]),
    "icepop": (8, ["algorithm.mismatch.mode=icepop"]),
    "m2po": (8, ["algorithm.mismatch.mode=m2po"]),
}
KEPT = (
    "reward/mean", "train/staleness_mean", "train/entropy", "train/ratio_max", "train/grad_norm",
    "train/mismatch_weight_mean", "train/mismatch_masked_fraction", "offpolicy/ess", "offpolicy/kl_mu_pi_old",
    "critic/explained_variance_0", "critic/explained_variance_1", "critic/disagreement",
    "asyppo/adv_masked_fraction", "asyppo/entropy_masked_fraction",
)


def _install_diagnostics() -> None:
    """Log the GAE advantages the policy gets: A = returns - mean critic value, per step."""
    import torch

    from cadence.train.critics import CriticEnsemble

    update = CriticEnsemble.update

    def update_with_diagnostics(self, batch, returns, old_values):  # noqa: ANN001, ANN202
        metrics = update(self, batch, returns, old_values)
        valid = batch.mask.bool()
        value = old_values.mean(0)
        adv = (returns - value)[valid]
        correct = (batch.rewards > 0.5)[:, None].expand_as(valid)[valid]
        first = valid.float().argmax(1)  # each answer's first token: V(prompt) against its reward
        v_first = value.gather(1, first[:, None]).squeeze(1)
        metrics |= {
            "diag/adv_mean": float(adv.mean()),
            "diag/adv_std": float(adv.std()),
            "diag/adv_positive": float((adv > 0).float().mean()),
            "diag/adv_correct": float(adv[correct].mean()) if correct.any() else float("nan"),
            "diag/adv_wrong": float(adv[~correct].mean()) if (~correct).any() else float("nan"),
            "diag/value_first": float(v_first.mean()),
            "diag/value_bias": float((v_first - batch.rewards).mean()),
            "diag/groups_all_same": _share_flat_groups(batch.group_ids, batch.rewards),
        }
        return metrics

    def _share_flat_groups(group_ids: torch.Tensor, rewards: torch.Tensor) -> float:
        groups = group_ids.unique()
        flat = [bool((rewards[group_ids == g] == rewards[group_ids == g][0]).all()) for g in groups]
        return sum(flat) / max(len(flat), 1)

    CriticEnsemble.update = update_with_diagnostics


def run_cell(name: str, alpha: int, algo: list[str], seed: int, setting: dict[str, Any], data: Path) -> dict:
    import torch

    torch.set_num_threads(1)
    _install_diagnostics()
    run = train_run(overrides([*ASYPPO, *algo], alpha, seed, setting, data))
    steps = [r for r in run.records if "reward/mean" in r]
    before = run.summary.eval_before.pass_at_1
    curve = [[0, before]] + [[r["step"], r["eval/pass@1"]] for r in run.records if "eval/pass@1" in r and r["step"] > 0]
    per_step = {k: [r.get(k, float("nan")) for r in steps] for k in (*KEPT, *_DIAG)}
    return {
        "variant": name, "alpha": alpha, "seed": seed, "overrides": algo, "curve": curve,
        "before": before, "after": run.summary.eval_after.pass_at_1, "best": max(p for _, p in curve),
        "wall_s": run.wall_s, "per_step": per_step,
    }


_DIAG = ("diag/adv_mean", "diag/adv_std", "diag/adv_positive", "diag/adv_correct", "diag/adv_wrong",
         "diag/value_first", "diag/value_bias", "diag/groups_all_same")


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.mean(xs) if xs else float("nan")


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for name in [v for v in VARIANTS if any(r["variant"] == v for r in runs)]:
        mine = sorted((r for r in runs if r["variant"] == name), key=lambda r: r["seed"])
        after = [r["after"] for r in mine]
        early = {k: _mean([_mean(r["per_step"][k][:10]) for r in mine]) for k in (*KEPT, *_DIAG)}
        late = {k: _mean([_mean(r["per_step"][k][-20:]) for r in mine]) for k in (*KEPT, *_DIAG)}
        rows.append({
            "variant": name, "alpha": mine[0]["alpha"], "seeds": [r["seed"] for r in mine],
            "after_mean": statistics.mean(after), "after_sd": statistics.stdev(after) if len(after) > 1 else 0.0,
            "per_seed": after, "best": [r["best"] for r in mine],
            "steps_1_10": early, "steps_41_60": late,
        })
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    setting = {**SETTING, "eval_every": 5}
    write_carry_task(DATA)
    partial = args.out.with_suffix(".partial.jsonl")
    done = {}
    if partial.exists():
        for line in partial.read_text().splitlines():
            run = json.loads(line)
            done[(run["variant"], run["seed"])] = run
    cells = [(v, *VARIANTS[v], s) for s in args.seeds for v in args.variants]
    todo = [c for c in cells if (c[0], c[3]) not in done]
    runs = [done[(c[0], c[3])] for c in cells if (c[0], c[3]) in done]
    began, t0, load = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), time.perf_counter(), os.getloadavg()
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(run_cell, *cell, setting, DATA) for cell in todo]
        for future in as_completed(futures):
            run = future.result()
            with partial.open("a") as f:
                f.write(json.dumps(run) + "\n")
            runs.append(run)
            print(f"{run['variant']:>34} seed={run['seed']}: {run['before']:.3f} -> {run['after']:.3f} "
                  f"(best {run['best']:.3f}), {run['wall_s']:.0f} s", flush=True)
    meta = {
        "date": began, "machine": f"{cpu_model()}, {os.cpu_count()} cores", "jobs": args.jobs,
        "setting": setting, "wall_s": time.perf_counter() - t0, "load_avg_start": load,
        "load_avg_end": os.getloadavg(),
        "command": shlex.join(["python", "benchmarks/asyppo_offpolicy.py", *(sys.argv[1:] if argv is None else argv)]),
    }
    result = {"meta": meta, "summary": summarise(runs), "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
