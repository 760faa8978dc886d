"""The RLVR recipe: rollout -> sample buffer -> trainer -> weight sync -> engine.

Components are built once from the config and composed here, in one process
(`runtime.kind=inline`). Synchronous training is this same loop with async
ratio 0: the buffer then only hands out groups of the current policy version.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from cadence.assemble import rollout_workers, run_trainer
from cadence.config import ConfigError, RunConfig, dump_config
from cadence.dashboard.beside import start_beside
from cadence.models.loading import load_policy, load_tokenizer
from cadence.observe.flat_rewards import FlatRewardWatch
from cadence.observe.metrics import MetricsLogger, read_jsonl
from cadence.observe.progress import TrainingBar
from cadence.observe.report import held_out_label, plot_curves, print_summary
from cadence.observe.reward_errors import CHECK_STEPS, RewardErrorReport
from cadence.observe.run_name import choose_run_name
from cadence.observe.run_status import RunStatus
from cadence.observe.run_trace import RunTrace
from cadence.rollout.evaluate import EvalResult
from cadence.runtime.placement import WorkerGroup, trainer_threads
from cadence.runtime.split import Split, measured_split
from cadence.runtime.threads import configure_threads, cpu_share
from cadence.runtime.trainer_group import TrainerGroup
from cadence.train.checkpoint import latest_checkpoint, load_state, save_checkpoint, set_rng_state
from cadence.train.resume import CONFIG_FILE, check_resume_config, record_changes, saved_config


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
    run_dir = cfg.logging.run_folder()
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
    progress = {"step": 0}  # the last step finished, for the Ctrl-C message
    workers = None
    status = progress["status"] = RunStatus(run_dir)  # status.json: what `cadence dashboard` shows
    status.start()
    dashboard = start_beside(cfg.logging.dashboard_port, run_dir) if cfg.logging.dashboard else None
    try:
        workers = rollout_workers(cfg)  # engines, rewards and prompts: in-process or Ray actors
        summary = _train(cfg, run_dir, workers, resume, progress)
        status.finish()
        return summary
    except KeyboardInterrupt:
        status.interrupted()
        raise TrainingInterrupted(run_dir, progress["step"], latest_checkpoint(run_dir)) from None
    except Exception as err:
        status.failed(err)
        raise
    finally:
        if dashboard is not None:
            dashboard.stop()
        if workers is not None:
            with contextlib.suppress(Exception):  # never hide the error that got us here
                workers.close()


def _train(cfg: RunConfig, run_dir: Path, workers: WorkerGroup, resume: bool, progress: dict) -> RunSummary:
    threads = configure_threads(trainer_threads(cfg.runtime))
    held_out = held_out_label(episodes=cfg.env is not None or cfg.agent is not None)  # agent runs are episodes too

    tokenizer = load_tokenizer(cfg.model.path)
    state = _resume_state(run_dir) if resume else None
    trainer = run_trainer(cfg, tokenizer.pad_token_id, state)
    policy = trainer.model  # data parallel: the driver's copy, given the ranks' weights at each sync

    start_step, counters = 0, {"samples": 0, "tokens": 0}
    eval_before = eval_after = None
    reward_errors = RewardErrorReport(run_dir)
    if state is not None:
        start_step = state["step"]
        trainer.load_state_dict(state["trainer"], state["path"])
        counters = state["counters"]
        eval_before = state.get("eval_before")
        set_rng_state(state["rng"])
        workers.update_weights(trainer.weights(), trainer.version)  # on CPU whatever trainer.device
        workers.load_state_dict(state["workers"], trainer.version)
        print(f"resumed from step {start_step} ({run_dir})")
    elif cfg.eval.before:
        eval_before = workers.evaluate(cfg.eval.samples)
        print(f"{held_out} before training: {eval_before.pass_at_1:.3f}")
        reward_errors.review(workers.reward_report(), 0)
    progress["step"] = start_step

    logger = MetricsLogger(
        run_dir,
        cfg.model_dump(mode="json"),
        resume_step=start_step,
        tensorboard=cfg.logging.tensorboard,
        wandb=cfg.logging.wandb,
        mlflow=cfg.logging.mlflow,
        name=cfg.logging.name,
    )
    if eval_before is not None and start_step == 0:
        logger.log(0, eval_before.as_metrics())  # step 0: the policy before any update
    trace = RunTrace(run_dir, cfg.logging, tokenizer, cfg.rollout.async_ratio, progress["status"], start_step)
    workers.start()
    began = time.perf_counter()
    eval_seconds = 0.0  # held-out evaluation inside the loop: not training time
    bar = TrainingBar(  # its ETA leaves out the first step's warm-up
        range(start_step + 1, cfg.trainer.steps + 1),
        initial=start_step,
        total=cfg.trainer.steps,
        desc="train",
        disable=not cfg.logging.progress,
        dynamic_ncols=True,
    )
    flat_rewards = FlatRewardWatch()  # warns if the first steps' groups all have equal rewards
    for step in bar:
        t0 = time.perf_counter()
        trace.waiting(step)
        groups = workers.get_batch(trainer.version)
        waited = time.perf_counter() - t0
        trace.batch(step, trainer.version, groups)
        metrics = trainer.step(groups)
        trace.syncing(step)
        t_sync = time.perf_counter()
        workers.update_weights(trainer.weights(), trainer.version)  # data parallel: gathered once
        sync_seconds = time.perf_counter() - t_sync
        trace.stepped(step)
        step_seconds = time.perf_counter() - t0

        flat_rewards.update(groups)
        samples = [s for g in groups for s in g.samples]
        rewards = torch.tensor([s.reward for s in samples])
        lengths = torch.tensor([len(s.response_ids) for s in samples], dtype=torch.float32)
        counters["samples"] += len(samples)
        counters["tokens"] += int(lengths.sum())
        metrics.update(
            {
                "reward/mean": float(rewards.mean()),
                "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
                "reward/accuracy": float((rewards >= 1.0).float().mean()),
                "reward/errors": float(sum(s.reward_error is not None for s in samples)),
                "response/length_mean": float(lengths.mean()),
                "response/length_max": float(lengths.max()),
                "response/truncated_fraction": sum(s.finish_reason == "length" for s in samples) / len(samples),
                # Responses whose tokens came from more than one policy version (interruptible generation).
                "response/interrupted_fraction": sum(
                    s.finish_version is not None and s.finish_version != s.version for s in samples
                ) / len(samples),
                "time/step": step_seconds,
                "time/trainer_idle": waited,
                "time/weight_sync": sync_seconds,
                "perf/weight_sync_s": sync_seconds,
                "perf/samples_per_s": len(samples) / step_seconds,
                "perf/tokens_per_s": float(lengths.sum()) / step_seconds,
                "progress/samples_total": float(counters["samples"]),
                **workers.metrics(),
            }
        )
        last = step == cfg.trainer.steps
        if (cfg.eval.every and step % cfg.eval.every == 0) or (last and cfg.eval.after):
            t_eval = time.perf_counter()
            trace.phase("evaluating", step)
            evaluated = workers.evaluate(cfg.eval.samples)
            eval_seconds += time.perf_counter() - t_eval
            metrics.update({**evaluated.as_metrics(), "time/eval": time.perf_counter() - t_eval})
            eval_after = evaluated if last else None
        if metrics["reward/errors"] or (step <= CHECK_STEPS and "eval/pass@1" in metrics):
            reward_errors.review(workers.reward_report(), step)
        logger.log(step, metrics)
        bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", acc=f"{metrics['reward/accuracy']:.2f}")

        if (cfg.checkpoint.every and step % cfg.checkpoint.every == 0) or last:
            trace.phase("checkpointing", step)
            save_checkpoint(
                run_dir,
                step,
                policy,
                tokenizer,
                {
                    "trainer": trainer.state_dict(),
                    "workers": workers.state_dict(),
                    "counters": dict(counters),
                    "eval_before": eval_before,
                },
                keep=cfg.checkpoint.keep,
                files={CONFIG_FILE: dump_config(cfg)},
                write_shards=trainer.save_sharded if cfg.runtime.trainer_workers > 1 else None,
            )
        progress["step"] = step
    bar.close()
    trace.close()
    seconds = time.perf_counter() - began - eval_seconds
    rollout_metrics = workers.metrics()
    workers.stop()  # no more training rollouts
    if isinstance(trainer, TrainerGroup):
        trainer.close()
    if cfg.eval.after and eval_after is None:  # resumed after the last step: nothing ran
        eval_after = workers.evaluate(cfg.eval.samples)
    logger.close()
    records = read_jsonl(run_dir / "metrics.jsonl")
    if records:
        plot_curves(records, run_dir / "reward_curve.png", held_out_name=held_out)
    split = measured_split(
        records, cfg.batch_size, cfg.runtime.rollout_workers, cfg.rollout.async_ratio, cfg.trainer.epochs
    )
    summary = RunSummary(run_dir, cfg.trainer.steps, seconds, eval_before, eval_after)
    runtime = f"{cfg.runtime.kind}, async ratio {cfg.rollout.async_ratio}, trainer threads {threads}"
    _print_summary(summary, counters, rollout_metrics, split, runtime, held_out)
    write_summary(summary, counters, rollout_metrics)
    return summary


def write_summary(summary: RunSummary, counters: dict, rollout: dict) -> Path:
    """`<run>/summary.json`: the numbers of the summary table, for scripts and docs."""
    before, after = summary.eval_before, summary.eval_after
    data = {
        "steps": summary.steps,
        "seconds": round(summary.seconds, 3),
        "samples_trained": counters["samples"],
        "tokens_generated": counters["tokens"],
        "reward_errors": int(rollout.get("rollout/reward_errors_total", 0)),
        "stale_groups_dropped": int(rollout.get("buffer/dropped_groups", 0)),
        "eval_before": asdict(before) if before is not None else None,
        "eval_after": asdict(after) if after is not None else None,
        "pass_at_1_change": after.pass_at_1 - before.pass_at_1 if before and after else None,
    }
    path = summary.run_dir / "summary.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def _resume_state(run_dir: Path) -> dict | None:
    found = latest_checkpoint(run_dir)
    if found is None:
        print(f"--resume: no checkpoint in {run_dir}; starting from scratch")
        return None
    step, path = found
    state = load_state(path)
    state["path"] = path  # a data-parallel checkpoint's optimizer shards are read from there
    # Through from_pretrained, so tied weights (absent from the file) come back too.
    state["weights"] = load_policy(str(path)).state_dict()
    return state


def _print_summary(
    summary: RunSummary, counters: dict, rollout: dict, split: Split | None, runtime: str, held_out: str
) -> None:
    """The end-of-run table; `runtime` and `held_out` (what evaluation measures) as printed."""
    before, after = summary.eval_before, summary.eval_after
    rows = [
        ("run dir", str(summary.run_dir)),
        ("steps", str(summary.steps)),
        ("samples trained", str(counters["samples"])),
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
