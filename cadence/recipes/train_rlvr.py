"""The RLVR recipe: rollout -> sample buffer -> trainer -> weight sync -> engine.

Components are built once from the config and composed here, in one process
(`runtime.kind=inline`). Synchronous training is this same loop with async
ratio 0: the buffer then only hands out groups of the current policy version.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from cadence.assemble import rollout_workers, run_trainer
from cadence.config import ConfigError, RunConfig, dump_config
from cadence.dashboard.beside import start_beside
from cadence.models.loading import load_tokenizer
from cadence.observe.metrics import read_jsonl
from cadence.observe.report import held_out_label, plot_curves, print_summary
from cadence.observe.run_name import choose_run_name
from cadence.observe.run_status import RunStatus
from cadence.observe.step_report import StepReport
from cadence.recipes.evaluator import Evaluator
from cadence.rollout.evaluate import EvalResult
from cadence.runtime.placement import WorkerGroup, trainer_threads
from cadence.runtime.split import Split, measured_split
from cadence.runtime.threads import configure_threads, cpu_share
from cadence.train.checkpoint import latest_checkpoint
from cadence.train.checkpointer import Checkpointer
from cadence.train.resume import check_resume_config, record_changes, saved_config
from cadence.train.run_state import Counters, RunState


@dataclass
class RunSummary:
    run_dir: Path
    steps: int
    seconds: float
    eval_before: EvalResult | None
    eval_after: EvalResult | None


class TrainingInterrupted(Exception):
    """Ctrl-C during `train`: where the run got to and what is on disk to resume from."""

    def __init__(self, run_dir: Path, step: int, checkpoint: tuple[int, Path] | None) -> None:
        super().__init__(f"interrupted at step {step}")
        self.run_dir, self.step, self.checkpoint = run_dir, step, checkpoint


def prepare_run_dir(cfg: RunConfig, resume: bool, allow_change: list[str] | None = None) -> Path:
    """The run folder, checked before anything loads: a fresh run never overwrites checkpoints,
    and a resumed one keeps its config unless the changed fields are allowed (then recorded)."""
    choose_run_name(cfg.logging, resume)  # as `cadence train` does (a no-op once it has): a resume keeps its name
    run_dir = cfg.run_dir()
    found = latest_checkpoint(run_dir) if run_dir.exists() else None
    if found and not resume:
        raise ConfigError(
            f"{run_dir} already holds checkpoints; pass --resume to continue it, or set "
            "logging.name=<new name> for a fresh run"
        )
    if found:
        step, path = found
        saved = saved_config(path, run_dir)
        if saved is not None:
            changes = check_resume_config(saved, cfg.model_dump(mode="json"), allow_change or [], str(path),
                                          defaults=RunConfig().model_dump(mode="json"))
            if changes:
                record_changes(run_dir, step, changes)
        return run_dir  # config.yaml stays the config the run started with
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    return run_dir


def train(cfg: RunConfig, resume: bool = False, allow_change: list[str] | None = None) -> RunSummary:
    torch.manual_seed(cfg.seed)
    run_dir = prepare_run_dir(cfg, resume, allow_change)
    if cfg.rollout.async_ratio > 0 and cfg.algorithm.ignores_staleness:
        print(
            f"note: algorithm.loss={cfg.algorithm.loss} with algorithm.mismatch.mode=none does not "
            f"correct for staleness: samples up to rollout.async_ratio={cfg.rollout.async_ratio} "
            "versions old are trained as if fresh (mismatch.mode=auto or an off-policy loss corrects them)"
        )
    workers = None
    status = RunStatus(run_dir)  # status.json: what `cadence dashboard` shows; its step is the last one logged
    status.start()
    dashboard = start_beside(cfg.logging.dashboard_port, run_dir) if cfg.logging.dashboard else None
    try:
        workers = rollout_workers(cfg)  # engines, rewards and prompts: in-process or Ray actors
        summary = _train(cfg, run_dir, workers, resume, status)
        status.finish()
        return summary
    except KeyboardInterrupt:
        status.interrupted()
        raise TrainingInterrupted(run_dir, status.step, latest_checkpoint(run_dir)) from None
    except Exception as err:
        status.failed(err)
        raise
    finally:
        if dashboard is not None:
            dashboard.stop()
        if workers is not None:
            with contextlib.suppress(Exception):  # never hide the error that got us here
                workers.close()


def _train(cfg: RunConfig, run_dir: Path, workers: WorkerGroup, resume: bool, status: RunStatus) -> RunSummary:
    """Rollout -> train -> weight sync, step after step; its collaborators decide when they are due."""
    threads = configure_threads(trainer_threads(cfg.runtime))
    held_out = held_out_label(episodes=cfg.run_kind.plays_episodes)
    tokenizer = load_tokenizer(cfg.model.path)
    checkpoints = Checkpointer(run_dir, cfg.checkpoint, cfg.trainer.steps, tokenizer, dump_config(cfg))
    folder = checkpoints.latest() if resume else None
    trainer = run_trainer(cfg, tokenizer.pad_token_id, folder)
    evaluator = Evaluator(cfg.eval, cfg.trainer.steps, workers, held_out)
    run = checkpoints.restore(folder, trainer, workers) if folder else RunState(eval_before=evaluator.before())
    report = StepReport(run_dir, cfg.logging, run, cfg.trainer.steps, workers, status, tokenizer,
                        cfg.rollout.async_ratio, cfg.model_dump(mode="json"))
    workers.start()
    for step in report.steps():
        report.waiting(step)
        groups = workers.get_batch(trainer.version)
        report.batch(step, trainer.version, groups)
        metrics = trainer.step(groups)
        report.syncing(step)
        workers.update_weights(trainer.weights(), trainer.version)  # data parallel: gathered once
        metrics = report.stepped(step, groups, metrics)
        if evaluator.due(step):
            report.phase("evaluating", step)
            metrics |= evaluator.run(step)
        report.log(step, metrics)
        run.step = step
        if checkpoints.due(step):
            report.phase("checkpointing", step)
            checkpoints.save(run, trainer, workers)
    seconds = report.close() - evaluator.seconds  # held-out evaluation inside the loop is not training time
    rollout_metrics = workers.metrics()
    workers.stop()  # no more training rollouts
    trainer.close()
    summary = RunSummary(run_dir, cfg.trainer.steps, seconds, run.eval_before, evaluator.after())
    _finish(cfg, summary, run.counters, rollout_metrics, f"trainer threads {threads}", held_out)
    return summary


def _finish(cfg: RunConfig, summary: RunSummary, counters: Counters, rollout: dict, threads: str, held_out: str) -> None:
    """The reward curve, the summary table and summary.json."""
    records = read_jsonl(summary.run_dir / "metrics.jsonl")
    if records:
        plot_curves(records, summary.run_dir / "reward_curve.png", held_out_name=held_out)
    split = measured_split(
        records, cfg.batch_size, cfg.runtime.rollout_workers, cfg.rollout.async_ratio, cfg.trainer.epochs
    )
    runtime = f"{cfg.runtime.kind}, async ratio {cfg.rollout.async_ratio}, {threads}"
    _print_summary(summary, counters, rollout, split, runtime, held_out)
    write_summary(summary, counters, rollout)


def write_summary(summary: RunSummary, counters: Counters, rollout: dict) -> Path:
    """`<run>/summary.json`: the numbers of the summary table, for scripts and docs."""
    before, after = summary.eval_before, summary.eval_after
    data = {
        "steps": summary.steps,
        "seconds": round(summary.seconds, 3),
        "samples_trained": counters.samples,
        "tokens_generated": counters.tokens,
        "reward_errors": int(rollout.get("rollout/reward_errors_total", 0)),
        "stale_groups_dropped": int(rollout.get("buffer/dropped_groups", 0)),
        "eval_before": asdict(before) if before is not None else None,
        "eval_after": asdict(after) if after is not None else None,
        "pass_at_1_change": after.pass_at_1 - before.pass_at_1 if before and after else None,
    }
    path = summary.run_dir / "summary.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def _print_summary(
    summary: RunSummary, counters: Counters, rollout: dict, split: Split | None, runtime: str, held_out: str
) -> None:
    """The end-of-run table; `runtime` and `held_out` (what evaluation measures) as printed."""
    before, after = summary.eval_before, summary.eval_after
    rows = [
        ("run dir", str(summary.run_dir)),
        ("steps", str(summary.steps)),
        ("samples trained", str(counters.samples)),
        ("wall time (this process)", f"{summary.seconds:.1f} s"),
        ("runtime", runtime),
        ("reward errors (contained)", str(int(rollout.get("rollout/reward_errors_total", 0)))),
        ("stale groups dropped", str(int(rollout.get("buffer/dropped_groups", 0)))),
    ]
    if before is not None:
        rows.append((f"{held_out} before", f"{before.pass_at_1:.3f}"))
    if after is not None:
        rows.append((f"{held_out} after", f"{after.pass_at_1:.3f}"))
    if before is not None and after is not None:
        rows.append(("change", f"{100 * (after.pass_at_1 - before.pass_at_1):+.1f} points"))
    if split is not None:
        rollout_cores, train_cores = split.cores(cpu_share())
        rows.append(
            (
                "suggested training share beta*",
                f"{split.beta:.2f} (mu_gen {1e3 * split.mu_gen:.1f} ms, L_gen {split.l_gen:.2f} s, "
                f"mu_train {1e3 * split.mu_train:.1f} ms per sample; here: {rollout_cores} rollout + "
                f"{train_cores} training cores)",
            )
        )
    rows.append(("reward curve", str(summary.run_dir / "reward_curve.png")))
    print_summary(rows)
