"""AsyPPO at off-policy ratio 8: why it collapses on the carry task, and what makes it hold (issue 27).

    python benchmarks/asyppo_offpolicy.py          # the table in docs/asyppo.md (14 variants x 3 seeds)
    python benchmarks/asyppo_offpolicy.py --variants icepop m2po --seeds 0 --out /tmp/a.json   # probes

The setting is benchmarks/offpolicy_stability.py's (`overrides`): the carry
task, 60 steps, lr 3e-4, 8 prompts x 8 answers, inline runtime, up to alpha
versions of staleness; held-out pass@1 every 5 steps here. Every variant is
`algorithm.name=asyppo` with one switch (`VARIANTS`; `TABLE` is the documented
set). Beside the held-out curve each run keeps per-step diagnostics: the
critics' explained variance and signed error, the GAE advantages' batch mean,
std and sign balance, the share of tokens AsyPPO's masks drop, the policy's
entropy, the importance weights' ESS and KL(mu || pi_old), staleness, training
reward, and the gradient split: d loss / d log pi summed over the tokens of
correct answers (pulled up) and of wrong ones (pushed down).

The diagnostics come from wrapping `CriticEnsemble.update` (it receives the
GAE returns and the critics' values, A = returns - V) and the trainer's
`compute_policy_loss` (a second, detached evaluation of the same loss), so the
library is not changed to measure them. Each finished run is appended to
<out>.partial.jsonl, and a rerun skips the runs found there.
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
DOC = ROOT / "docs" / "asyppo.md"
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
    "weight, grad_clip 0.2": (8, ["trainer.grad_clip=0.2"]),
    "topr loss": (8, ["algorithm.loss=topr"]),
    "icepop": (8, ["algorithm.mismatch.mode=icepop"]),
    "m2po": (8, ["algorithm.mismatch.mode=m2po"]),
    "weight, centred advantages": (8, ["algorithm.whiten_advantages=true"]),
    "weight, scaled advantages": (8, ["algorithm.whiten_advantages=true"]),
    "topr, whitened advantages": (8, ["algorithm.loss=topr", "algorithm.whiten_advantages=true"]),
    "sync (alpha 0), whitened": (0, ["algorithm.whiten_advantages=true"]),
    # No critics: the last algorithm.name wins. Only its gradient split and off-policy metrics apply.
    "grpo + pi_old/mu weight (reference)": (8, ["algorithm.name=grpo"]),
}
# The documented table (docs/asyppo.md), 3 seeds each; the other variants were one-seed probes.
TABLE = (
    "sync (alpha 0), pi_old/mu weight", "sync (alpha 0), whitened", "no correction", "pi_old/mu weight (default)",
    "weight, no masks", "weight, centred advantages", "weight, scaled advantages", "weight, whitened advantages",
    "weight, grad_clip 0.2", "weight, lr 1e-4", "icepop", "m2po", "topr loss", "topr, whitened advantages",
)
# Which half of whitening acts: these variants replace `whiten` (x - mean) / std by one half of it.
WHITEN_HALF = {"weight, centred advantages": "centre", "weight, scaled advantages": "scale"}
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
    _install_gradient_split()


def _install_gradient_split() -> None:
    """Log where the policy gradient goes: d loss / d log pi per token, summed over the tokens of
    correct answers (pushed up) and of wrong ones (pushed down), weights, masks and clip included."""
    import dataclasses

    import torch

    from cadence.train import trainer

    compute = trainer.compute_policy_loss

    def with_split(inputs, cfg, **kw):  # noqa: ANN001, ANN003, ANN202
        out = compute(inputs, cfg, **kw)
        logprobs = inputs.logprobs.detach().requires_grad_()
        with torch.enable_grad():
            loss = compute(dataclasses.replace(inputs, logprobs=logprobs), cfg, **kw).loss
            (grad,) = torch.autograd.grad(loss, logprobs)
        correct = (inputs.sequence_rewards > 0.5)[:, None] & inputs.mask.bool()
        wrong = (inputs.sequence_rewards <= 0.5)[:, None] & inputs.mask.bool()
        up, down = float(-grad[correct].sum()), float(grad[wrong].sum())
        out.metrics["diag/push_up_correct"] = up  # > 0: correct answers made more likely
        out.metrics["diag/push_down_wrong"] = down  # > 0: wrong answers made less likely
        return out

    trainer.compute_policy_loss = with_split
    trainer.ADDITIVE_METRICS = {*trainer.ADDITIVE_METRICS, "diag/push_up_correct", "diag/push_down_wrong"}


def _whiten_half(half: str) -> None:
    """Make `whiten_advantages` only subtract the batch mean ("centre") or only divide by the std ("scale")."""
    from cadence.algo import advantages

    def partial_whiten(x, mask, eps):  # noqa: ANN001, ANN202
        n = mask.sum().clamp(min=1.0)
        mean = (x * mask).sum() / n
        if half == "centre":
            return (x - mean) * mask
        std = (((x - mean).square() * mask).sum() / (n - 1).clamp(min=1.0)).sqrt()
        return x / (std + eps) * mask

    advantages.whiten = partial_whiten


def run_cell(name: str, alpha: int, algo: list[str], seed: int, setting: dict[str, Any], data: Path) -> dict:
    import torch

    torch.set_num_threads(1)
    _install_diagnostics()
    if name in WHITEN_HALF:
        _whiten_half(WHITEN_HALF[name])
    run = train_run(overrides([*ASYPPO, *algo], alpha, seed, setting, data))
    steps = [r for r in run.records if "reward/mean" in r]
    before = run.summary.eval_before.pass_at_1
    curve = [[0, before]] + [[r["step"], r["eval/pass@1"]] for r in run.records if "eval/pass@1" in r and r["step"] > 0]
    per_step = {k: [r.get(k, float("nan")) for r in steps] for k in (*KEPT, *_DIAG)}
    return {
        "variant": name, "alpha": alpha, "seed": seed, "overrides": algo, "curve": curve,
        "before": before, "after": run.summary.eval_after.pass_at_1, "best": max(p for _, p in curve),
        "wall_s": run.wall_s, "load_avg": os.getloadavg()[0], "per_step": per_step,
    }


_DIAG = ("diag/adv_mean", "diag/adv_std", "diag/adv_positive", "diag/adv_correct", "diag/adv_wrong",
         "diag/value_first", "diag/value_bias", "diag/groups_all_same", "diag/push_up_correct",
         "diag/push_down_wrong")


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.mean(xs) if xs else float("nan")


def _median(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def _late(run: dict[str, Any], key: str) -> float:
    """A per-step metric's mean over steps 11-60, once the generator is the full alpha ahead."""
    return _mean(run["per_step"][key][10:])


def _push_down_share(run: dict[str, Any]) -> float:
    """Over steps 11-60: the share of the policy gradient (d loss / d log pi) that pushes wrong answers
    down rather than correct ones up. NaN for runs made before this diagnostic existed."""
    up = run["per_step"].get("diag/push_up_correct", [float("nan")] * 60)[10:]
    down = run["per_step"].get("diag/push_down_wrong", [float("nan")] * 60)[10:]
    return _mean([max(d, 0.0) / (max(u, 0.0) + max(d, 0.0)) for u, d in zip(up, down, strict=True) if u + d > 0])


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per variant: final held-out pass@1 mean +- sd over seeds, best, and the diagnostics."""
    rows = []
    for name in [v for v in dict.fromkeys([*TABLE, *VARIANTS]) if any(r["variant"] == v for r in runs)]:
        mine = sorted((r for r in runs if r["variant"] == name), key=lambda r: r["seed"])
        after = [r["after"] for r in mine]
        rows.append({
            "variant": name, "alpha": mine[0]["alpha"], "overrides": mine[0]["overrides"],
            "seeds": [r["seed"] for r in mine], "per_seed": after, "best": [r["best"] for r in mine],
            "after_mean": statistics.mean(after), "after_sd": statistics.stdev(after) if len(after) > 1 else 0.0,
            "best_mean": statistics.mean(r["best"] for r in mine),
            # Steps 11-60: the sampler-trainer KL, the importance weights' ESS, how far the batch's
            # mean GAE advantage is from 0 (what whitening removes), training reward.
            **{label: _mean([_late(r, key) for r in mine]) for label, key in DIAGNOSTICS.items()},
            # Median: a batch whose returns are all equal has an explained variance of -inf or NaN.
            "explained_variance": _mean([_median(r["per_step"]["critic/explained_variance_0"][10:]) for r in mine]),
            "push_down_share": _mean([_push_down_share(r) for r in mine]),
            "push_down_runs": sum(_push_down_share(r) == _push_down_share(r) for r in mine),
            "abs_adv_mean": _mean([_mean([abs(x) for x in r["per_step"]["diag/adv_mean"][10:]]) for r in mine]),
        })
    return rows


DIAGNOSTICS = {
    "kl_mu_pi_old": "offpolicy/kl_mu_pi_old", "ess": "offpolicy/ess", "reward": "reward/mean",
    "entropy": "train/entropy", "adv_masked": "asyppo/adv_masked_fraction",
}


def _num(x: float) -> str:
    return "–" if x != x else f"{x:.2f}"  # NaN: no critics (the GRPO reference)


def _share(row: dict[str, Any]) -> str:
    return "–" if not row["push_down_runs"] else f"{row['push_down_share']:.2f} ({row['push_down_runs']})"


def markdown_table(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [
        "| variant | alpha | final pass@1 (mean ± sd) | per seed | best (mean) | KL(mu ‖ pi_old) | ESS "
        "| gradient on wrong answers (runs) | abs. batch-mean GAE advantage | train reward | critic EV |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["summary"]:
        lines.append(
            f"| {row['variant']} | {row['alpha']} | {row['after_mean']:.3f} ± {row['after_sd']:.3f} | "
            f"{' / '.join(f'{x:.2f}' for x in row['per_seed'])} | {row['best_mean']:.3f} | "
            f"{row['kl_mu_pi_old']:.2f} | {row['ess']:.2f} | {_share(row)} | {_num(row['abs_adv_mean'])} | "
            f"{row['reward']:.2f} | {_num(row['explained_variance'])} |"
        )
    lines.append(
        f"\n{len(result['runs'])} runs on {meta['machine']}, {meta['jobs']} at a time (1 torch thread each): "
        f"{sum(r['wall_s'] for r in result['runs']) / 60:.0f} min of run time, about "
        f"{sum(r['wall_s'] for r in result['runs']) / 60 / meta['jobs']:.0f} min of wall time; last written "
        f"{meta['date']}. Diagnostics: means over steps 11-60; `–`: not measured on these runs."
    )
    return "\n".join(lines)


def _rounded(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 4)
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    return x


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", nargs="+", default=list(TABLE), choices=list(VARIANTS))
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
    runs = list(done.values())  # every finished run, probes of other variants and seeds included
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
    args.out.write_text(json.dumps(_rounded(result)))  # compact: 39 runs x 60 steps x 24 metrics
    table = markdown_table(result)
    print(table)
    if args.out == RESULTS:  # the documented table; any other --out only prints it
        from cadence.observe.report import write_doc_table

        write_doc_table(DOC, "asyppo-offpolicy", table)
    return result


if __name__ == "__main__":
    main()
