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
from cadence.data.tasks import build_task
from cadence.inference.config import build_engine
from cadence.inference.types import SamplingParams
from cadence.models.loading import frozen_copy, load_policy, load_tokenizer
from cadence.observe.metrics import MetricsLogger, read_jsonl
from cadence.observe.report import plot_curves, print_summary
from cadence.rewards.guard import RewardGuard
from cadence.rewards.verifiers import build_reward
from cadence.rollout.buffer import SampleBuffer
from cadence.rollout.evaluate import EvalResult, evaluate
from cadence.rollout.prompts import PromptStream
from cadence.rollout.rlvr import RLVRRollout
from cadence.runtime.threads import configure_threads
from cadence.train.checkpoint import latest_checkpoint, load_state, save_checkpoint, set_rng_state
from cadence.train.credit import AttentionCredit
from cadence.train.critics import CriticEnsemble
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
    threads = configure_threads(cfg.runtime.threads)
    torch.manual_seed(cfg.seed)
    run_dir = prepare_run_dir(cfg, resume)

    tokenizer = load_tokenizer(cfg.model.path)
    policy = load_policy(cfg.model.path, cfg.model.dtype)
    task = build_task(cfg.task)
    reward = RewardGuard(build_reward(cfg.reward, task), cfg.reward.timeout_s, cfg.reward.workers)
    # Exactly the prompts this run will use, so the stream's cursor pins down the data order.
    needed = cfg.trainer.steps * cfg.rollout.prompts_per_step
    stream = PromptStream(task.prompts("train", needed, cfg.seed), cfg.seed)
    test_prompts = task.prompts("test", cfg.task.test_size, cfg.seed)
    stop = cfg.rollout.stop if cfg.rollout.stop is not None else list(task.stop)
    params = SamplingParams(
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        stop=stop,
    )
    eval_params = SamplingParams(
        max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.eval.temperature, stop=stop
    )

    reference = frozen_copy(policy) if cfg.algorithm.kl.coef > 0 else None
    state = _resume_state(run_dir) if resume else None
    if state is not None:
        policy.load_state_dict(state["weights"])
    engine = build_engine(cfg.rollout.engine, frozen_copy(policy), tokenizer)
    critics = (
        CriticEnsemble(cfg.algorithm.critic, policy, cfg.model.path, cfg.seed, cfg.trainer.micro_batch_size)
        if cfg.algorithm.uses_critics
        else None
    )
    credit = (
        AttentionCredit(policy, cfg.algorithm.rhythm, tokenizer.pad_token_id)
        if cfg.algorithm.credit != "none"
        else None
    )
    trainer = PolicyTrainer(
        policy, cfg.trainer, cfg.algorithm, cfg.rollout.temperature, tokenizer.pad_token_id, reference,
        critics=critics, credit=credit,
    )
    buffer = SampleBuffer(cfg.rollout.async_ratio)
    rollout = RLVRRollout(engine, tokenizer, stream, reward, params, cfg.rollout.group_size)

    start_step, counters = 0, {"samples": 0, "tokens": 0, "reward_errors": 0}
    eval_before = None
    if state is not None:
        start_step = state["step"]
        trainer.load_state_dict(state["trainer"])
        stream.load_state_dict(state["prompts"])
        rollout._next_group_id = state["next_group_id"]
        counters = state["counters"]
        eval_before = state.get("eval_before")
        set_rng_state(state["rng"])
        if "engine_rng" in state and hasattr(engine, "generator"):
            engine.generator.set_state(state["engine_rng"])
        engine.update_weights(policy.state_dict(), trainer.version)
        print(f"resumed from step {start_step} ({run_dir})")
    elif cfg.eval.before:
        eval_before = evaluate(engine, tokenizer, test_prompts, reward, eval_params, cfg.eval.samples)
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
        roll = rollout.produce(cfg.rollout.prompts_per_step, buffer)
        groups = buffer.get_batch(cfg.rollout.prompts_per_step, trainer.version)
        metrics = trainer.step(groups)
        t_sync = time.perf_counter()
        engine.update_weights(policy.state_dict(), trainer.version)
        sync_seconds = time.perf_counter() - t_sync
        step_seconds = time.perf_counter() - t0

        samples = [s for g in groups for s in g.samples]
        rewards = torch.tensor([s.reward for s in samples])
        lengths = torch.tensor([len(s.response_ids) for s in samples], dtype=torch.float32)
        counters["samples"] += len(samples)
        counters["tokens"] += int(lengths.sum())
        counters["reward_errors"] += roll.reward_errors
        metrics.update(
            {
                "reward/mean": float(rewards.mean()),
                "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
                "reward/accuracy": float((rewards >= 1.0).float().mean()),
                "reward/errors_total": float(counters["reward_errors"]),
                "response/length_mean": float(lengths.mean()),
                "response/length_max": float(lengths.max()),
                "response/truncated_fraction": roll.finish_reasons.get("length", 0) / max(1, roll.samples),
                "time/step": step_seconds,
                "time/rollout": roll.seconds,
                "time/weight_sync": sync_seconds,
                "perf/samples_per_s": len(samples) / step_seconds,
                "perf/tokens_per_s": float(lengths.sum()) / step_seconds,
                "progress/samples_total": float(counters["samples"]),
                **buffer.stats(),
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
                    "prompts": stream.state_dict(),
                    "next_group_id": rollout._next_group_id,
                    "counters": dict(counters),
                    "eval_before": eval_before,
                    **({"engine_rng": engine.generator.get_state()} if hasattr(engine, "generator") else {}),
                },
                keep=cfg.checkpoint.keep,
            )
    bar.close()
    logger.close()
    seconds = time.perf_counter() - began

    eval_after = None
    if cfg.eval.after:
        eval_after = evaluate(engine, tokenizer, test_prompts, reward, eval_params, cfg.eval.samples)
    reward.close()
    records = read_jsonl(run_dir / "metrics.jsonl")
    if records:
        plot_curves(records, run_dir / "reward_curve.png")
    _print_summary(cfg, run_dir, seconds, counters, eval_before, eval_after, threads)
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


def _print_summary(cfg, run_dir, seconds, counters, before, after, threads) -> None:
    rows = [
        ("run dir", str(run_dir)),
        ("steps", str(cfg.trainer.steps)),
        ("samples trained", str(counters["samples"])),
        ("wall time (this process)", f"{seconds:.1f} s"),
        ("torch threads", str(threads)),
        ("reward errors", str(counters["reward_errors"])),
    ]
    if before is not None:
        rows.append(("held-out pass@1 before", f"{before.pass_at_1:.3f}"))
    if after is not None:
        rows.append(("held-out pass@1 after", f"{after.pass_at_1:.3f}"))
    if before is not None and after is not None:
        rows.append(("change", f"{100 * (after.pass_at_1 - before.pass_at_1):+.1f} points"))
    rows.append(("reward curve", str(run_dir / "reward_curve.png")))
    print_summary(rows)
