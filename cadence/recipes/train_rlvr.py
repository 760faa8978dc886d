"""The RLVR recipe: rollout -> sample buffer -> trainer -> weight sync -> engine.

Components are built once from the config and composed here, in one process
(`runtime.kind=inline`). Synchronous training is this same loop with async
ratio 0: the buffer then only hands out groups of the current policy version.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from cadence.config import ConfigError, RunConfig, dump_config
from cadence.models.loading import frozen_copy, load_policy, load_tokenizer
from cadence.observe.metrics import MetricsLogger, read_jsonl
from cadence.observe.report import plot_curves, print_summary
from cadence.rollout.evaluate import EvalResult
from cadence.runtime.placement import WorkerGroup, trainer_threads
from cadence.runtime.split import measured_split
from cadence.runtime.threads import configure_threads, cpu_share
from cadence.train.checkpoint import latest_checkpoint, load_state, save_checkpoint, set_rng_state
from cadence.train.credit import AttentionCredit, RemoteCredit
from cadence.train.critics import CriticEnsemble, RemoteCritics
from cadence.train.trainer import PolicyTrainer


@dataclass
class RunSummary:
    run_dir: Path
    steps: int
    seconds: float
    eval_before: EvalResult | None
    eval_after: EvalResult | None


def prepare_run_dir(cfg: RunConfig, resume: bool) -> Path:
    run_dir = cfg.run_dir()
    if run_dir.exists() and latest_checkpoint(run_dir) and not resume:
        raise ConfigError(
            f"{run_dir} already holds checkpoints; pass --resume to continue it, or set "
            "logging.name=<new name> for a fresh run"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    return run_dir


def train(cfg: RunConfig, resume: bool = False) -> RunSummary:
    torch.manual_seed(cfg.seed)
    run_dir = prepare_run_dir(cfg, resume)
    workers = WorkerGroup(cfg)  # engines, rewards and prompts: in-process or Ray actors
    threads = configure_threads(trainer_threads(cfg))

    tokenizer = load_tokenizer(cfg.model.path)
    policy = load_policy(cfg.model.path, cfg.model.dtype)
    reference = frozen_copy(policy) if cfg.algorithm.kl.coef > 0 else None
    state = _resume_state(run_dir) if resume else None
    if state is not None:
        policy.load_state_dict(state["weights"])
    critics = None
    if cfg.runtime.critic_actor:
        critics = RemoteCritics(
            cfg.algorithm.critic, cfg.model.path, cfg.seed, cfg.trainer.micro_batch_size, cfg.runtime.critic_cpus
        )
    elif cfg.algorithm.uses_critics:
        critics = CriticEnsemble(cfg.algorithm.critic, policy, cfg.model.path, cfg.seed, cfg.trainer.micro_batch_size)
    credit = None
    if cfg.runtime.credit_actor:
        credit = RemoteCredit(
            policy, cfg.model.path, cfg.algorithm.rhythm, tokenizer.pad_token_id, cfg.runtime.credit_cpus
        )
    elif cfg.algorithm.credit != "none":
        credit = AttentionCredit(policy, cfg.algorithm.rhythm, tokenizer.pad_token_id)
    trainer = PolicyTrainer(
        policy, cfg.trainer, cfg.algorithm, cfg.rollout.temperature, tokenizer.pad_token_id, reference,
        critics=critics, credit=credit,
    )

    start_step, counters = 0, {"samples": 0, "tokens": 0}
    eval_before = None
    if state is not None:
        start_step = state["step"]
        trainer.load_state_dict(state["trainer"])
        counters = state["counters"]
        eval_before = state.get("eval_before")
        set_rng_state(state["rng"])
        workers.update_weights(policy.state_dict(), trainer.version)
        workers.load_state_dict(state["workers"], trainer.version)
        print(f"resumed from step {start_step} ({run_dir})")
    elif cfg.eval.before:
        eval_before = workers.evaluate(cfg.eval.samples)
        print(f"held-out pass@1 before training: {eval_before.pass_at_1:.3f}")

    logger = MetricsLogger(
        run_dir,
        cfg.model_dump(mode="json"),
        resume_step=start_step,
        tensorboard=cfg.logging.tensorboard,
        wandb=cfg.logging.wandb,
        mlflow=cfg.logging.mlflow,
        name=cfg.logging.name,
    )
    workers.start()
    began = time.perf_counter()
    bar = tqdm(
        range(start_step + 1, cfg.trainer.steps + 1),
        initial=start_step,
        total=cfg.trainer.steps,
        desc="train",
        disable=not cfg.logging.progress,
        dynamic_ncols=True,
    )
    for step in bar:
        t0 = time.perf_counter()
        groups = workers.get_batch(trainer.version)
        waited = time.perf_counter() - t0
        metrics = trainer.step(groups)
        t_sync = time.perf_counter()
        workers.update_weights(policy.state_dict(), trainer.version)
        sync_seconds = time.perf_counter() - t_sync
        step_seconds = time.perf_counter() - t0

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
                "perf/samples_per_s": len(samples) / step_seconds,
                "perf/tokens_per_s": float(lengths.sum()) / step_seconds,
                "progress/samples_total": float(counters["samples"]),
                **workers.metrics(),
            }
        )
        logger.log(step, metrics)
        bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", acc=f"{metrics['reward/accuracy']:.2f}")

        last = step == cfg.trainer.steps
        if (cfg.checkpoint.every and step % cfg.checkpoint.every == 0) or last:
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
            )
    bar.close()
    logger.close()
    seconds = time.perf_counter() - began
    rollout_metrics = workers.metrics()
    workers.stop()  # no more training rollouts; the engines stay up for the final evaluation
    eval_after = workers.evaluate(cfg.eval.samples) if cfg.eval.after else None
    workers.close()
    records = read_jsonl(run_dir / "metrics.jsonl")
    if records:
        plot_curves(records, run_dir / "reward_curve.png")
    split = measured_split(
        records, cfg.batch_size, cfg.runtime.rollout_workers, cfg.rollout.async_ratio, cfg.trainer.epochs
    )
    _print_summary(cfg, run_dir, seconds, counters, eval_before, eval_after, threads, rollout_metrics, split)
    return RunSummary(run_dir, cfg.trainer.steps, seconds, eval_before, eval_after)


def _resume_state(run_dir: Path) -> dict | None:
    found = latest_checkpoint(run_dir)
    if found is None:
        print(f"--resume: no checkpoint in {run_dir}; starting from scratch")
        return None
    step, path = found
    state = load_state(path)
    # Through from_pretrained, so tied weights (absent from the file) come back too.
    state["weights"] = load_policy(str(path)).state_dict()
    return state


def _print_summary(cfg, run_dir, seconds, counters, before, after, threads, rollout, split) -> None:
    rows = [
        ("run dir", str(run_dir)),
        ("steps", str(cfg.trainer.steps)),
        ("samples trained", str(counters["samples"])),
        ("wall time (this process)", f"{seconds:.1f} s"),
        ("runtime", f"{cfg.runtime.kind}, async ratio {cfg.rollout.async_ratio}, trainer threads {threads}"),
        ("reward errors (contained)", str(int(rollout.get("rollout/reward_errors_total", 0)))),
        ("stale groups dropped", str(int(rollout.get("buffer/dropped_groups", 0)))),
    ]
    if before is not None:
        rows.append(("held-out pass@1 before", f"{before.pass_at_1:.3f}"))
    if after is not None:
        rows.append(("held-out pass@1 after", f"{after.pass_at_1:.3f}"))
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
    rows.append(("reward curve", str(run_dir / "reward_curve.png")))
    print_summary(rows)
