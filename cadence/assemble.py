"""The composition root: where a `RunConfig` becomes components.

Every component below takes its own config section or plain values; this module
is the one place that reads the whole run config to wire them together.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from cadence.config import RunConfig, RunKind
from cadence.data.build import build_task
from cadence.inference.build import build_engine
from cadence.inference.hub import InferenceHub
from cadence.inference.types import SamplingParams
from cadence.models.loading import frozen_copy, load_policy, load_tokenizer
from cadence.models.lora import with_lora
from cadence.observe.events import Timeline
from cadence.rewards.build import build_reward
from cadence.rewards.guard import RewardGuard
from cadence.rollout.producer import GroupProducer
from cadence.rollout.prompts import PromptStream
from cadence.rollout.render import PromptRenderer
from cadence.rollout.rlvr import GuardScorer, RLVRProducer, keeps
from cadence.rollout.worker import RolloutWorker, worker_quotas
from cadence.runtime.hosted import RemoteCredit, RemoteCritics
from cadence.runtime.placement import WorkerGroup
from cadence.runtime.threads import configure_threads
from cadence.runtime.trainer_group import TrainerGroup
from cadence.train.credit import AttentionCredit
from cadence.train.critics import CriticEnsemble
from cadence.train.data_parallel import DataParallel
from cadence.train.protocol import Trainer
from cadence.train.trainer import PolicyTrainer

# Training prompts are walked in shuffled blocks of this many: fixed, so the data order does
# not depend on trainer.steps (the default job's 200 steps x 16 prompts are exactly one block,
# so its data is what it was when the list was sized by the run's length).
PROMPT_BLOCK = 3200


class ConfiguredRolloutWorker(RolloutWorker):
    """A `RolloutWorker` built from a run config: what a Ray actor is constructed with (its
    arguments are small and picklable; the model loads inside the actor)."""

    def __init__(self, cfg: RunConfig, index: int = 0, workers: int = 1, threads: int = 0,
                 background: bool = True) -> None:
        threads = configure_threads(threads)
        ro, kind = cfg.rollout, cfg.run_kind
        tokenizer = load_tokenizer(cfg.model.path)
        if kind is RunKind.EPISODES:
            from cadence.rollout.turns import turn_format

            turns = turn_format(cfg.env, tokenizer)  # chat template or plain text; before the weights load
        policy = load_policy(cfg.model.path).eval()
        hub = InferenceHub([build_engine(ro.engine, policy, tokenizer)], interrupt=ro.interrupt_on_update)
        # Prompt replication over workers: every worker takes every prompt and generates its
        # share of the answers (answer j on worker j mod W); WorkerGroup joins the parts.
        spread = _replicated(cfg) and workers > 1
        if kind is RunKind.EPISODES:
            producer: GroupProducer = _episodes(cfg, hub, tokenizer, policy, turns, index, workers)
            extra = ro.extra_groups
        elif kind is RunKind.AGENTS:
            producer = _agent_runs(cfg, hub, tokenizer, policy, index, workers)
            extra = ro.extra_groups
        else:
            producer = _rlvr(cfg, hub, tokenizer, index, workers, spread)
            filtering = ro.filter_min_std is not None or ro.filter_mean_low is not None or ro.filter_mean_high is not None
            extra = ro.extra_prompts if filtering else 0
        super().__init__(
            producer, hub,
            quota=ro.prompts_per_step if spread else worker_quotas(ro.prompts_per_step, workers)[index],
            alpha=ro.async_ratio, extra=extra, background=background, interrupt=ro.interrupt_on_update,
            index=index, first_group_id=0 if spread else index, group_id_step=1 if spread else workers,
            threads=threads,
            # The pipeline view of `cadence dashboard`: spans of generating / waiting / weight_sync.
            timeline=Timeline(cfg.run_dir() if cfg.logging.events else None, f"rollout-{index}"),
        )


def rollout_workers(cfg: RunConfig) -> WorkerGroup:
    """The run's rollout workers, in this process or as Ray actors (runtime.kind)."""
    replicated = _replicated(cfg)
    return WorkerGroup(
        functools.partial(ConfiguredRolloutWorker, cfg), cfg.runtime, cfg.run_dir(),
        background=cfg.rollout.async_ratio > 0, replicated=replicated, trainer_device=cfg.trainer.device,
    )


def run_trainer(cfg: RunConfig, pad_id: int, checkpoint: Path | None = None) -> Trainer:
    """The run's trainer: a `PolicyTrainer` in this process, or `runtime.trainer_workers`
    data-parallel ranks (a `TrainerGroup`; this process keeps a copy of the policy to export),
    with the weights of a resumed run's `checkpoint` folder when given (its state loads later)."""
    # Through from_pretrained, so tied weights (absent from the file) come back too.
    weights = load_policy(str(checkpoint)).state_dict() if checkpoint is not None else None
    if cfg.runtime.trainer_workers == 1:
        return build_trainer(cfg, pad_id, weights)
    policy = load_policy(cfg.model.path, cfg.model.dtype)
    if weights is not None:
        policy.load_state_dict(weights)
    build = functools.partial(build_rank_trainer, cfg, pad_id, str(checkpoint) if checkpoint is not None else None)
    return TrainerGroup(build, cfg.trainer, cfg.runtime, model=policy)


def build_trainer(
    cfg: RunConfig, pad_id: int, weights: dict[str, torch.Tensor] | None = None, dp: DataParallel | None = None
) -> PolicyTrainer:
    """The trainer starting from `cfg.model.path`, or from `weights` (a resumed run's); the KL
    reference is always the starting model."""
    # LoRA: the KL reference is the base model inside the policy (adapters off), and a resumed
    # run's adapters come back with its trainer state.
    lora = cfg.model.lora.enabled
    policy = load_policy(cfg.model.path, cfg.model.dtype)
    reference = frozen_copy(policy) if cfg.algorithm.kl.coef > 0 and not lora else None
    if weights is not None and not lora:
        policy.load_state_dict(weights)
    critics = None
    if cfg.runtime.critic_actor:
        critics = RemoteCritics(
            cfg.algorithm.critic, cfg.model.path, cfg.seed, cfg.trainer.micro_batch_size, cfg.runtime.critic_cpus,
            cfg.runtime.critic_resources,
        )
    elif cfg.algorithm.uses_critics:
        critics = CriticEnsemble(cfg.algorithm.critic, policy, cfg.model.path, cfg.seed, cfg.trainer.micro_batch_size)
    credit = None
    if cfg.runtime.credit_actor:
        credit = RemoteCredit(
            policy, cfg.model.path, cfg.algorithm.credit, cfg.algorithm.rhythm, pad_id, cfg.runtime.credit_cpus,
            cfg.runtime.critic_resources, max_restarts=cfg.runtime.actor_restarts, run_dir=cfg.run_dir(),
        )
    elif cfg.algorithm.credit != "none":
        credit = AttentionCredit(policy, cfg.algorithm.credit, cfg.algorithm.rhythm, pad_id)
    if lora:  # after critics and credit have read the plain model
        policy = with_lora(policy, cfg.model.lora, cfg.seed)
    return PolicyTrainer(
        policy, cfg.trainer, cfg.algorithm, cfg.rollout.temperature, pad_id, reference,
        critics=critics, credit=credit, dp=dp,
    )


def build_rank_trainer(cfg: RunConfig, pad_id: int, checkpoint: str | None, dp: DataParallel) -> PolicyTrainer:
    """One data-parallel rank's trainer, from the run's checkpoint folder when resuming."""
    torch.manual_seed(cfg.seed)
    weights = load_policy(checkpoint, cfg.model.dtype).state_dict() if checkpoint else None
    return build_trainer(cfg, pad_id, weights, dp)


def _replicated(cfg: RunConfig) -> bool:
    """Prompt replication: every worker answers every prompt in part. Never episodes or agent runs:
    a group of those is played whole on one worker."""
    return cfg.rollout.replicate_prompts and cfg.run_kind is RunKind.RLVR


def _rlvr(cfg: RunConfig, hub: InferenceHub, tokenizer, index: int, workers: int, spread: bool) -> RLVRProducer:
    ro = cfg.rollout
    task = build_task(cfg.task)
    render = PromptRenderer.for_task(cfg.task, tokenizer, cfg.model.path)
    stop = ro.stop if ro.stop is not None else list(task.stop)
    ends = render.stop_token_ids()  # a chat template's end-of-turn token
    params = SamplingParams(max_new_tokens=ro.max_new_tokens, temperature=ro.temperature, top_p=ro.top_p, stop=stop,
                            stop_token_ids=ends)
    stride = 1 if spread else workers  # without replication, worker i takes every stride-th prompt

    def draw(n: int) -> list:
        return task.prompts("train", n * stride, cfg.seed)[index % stride :: stride]

    guard = RewardGuard(build_reward(cfg.reward, task), cfg.reward.timeout_s, cfg.reward.workers)
    return RLVRProducer(
        hub, render, PromptStream(draw, cfg.seed if spread else cfg.seed + index, PROMPT_BLOCK), GuardScorer(guard),
        params,
        answers=len(range(index, ro.group_size, workers)) if spread else ro.group_size,
        replicate=ro.replicate_prompts, slots=ro.engine.max_batch_size,
        length_sampler=_length_sampler(cfg, index),
        keep=lambda group: keeps(group, ro.filter_min_std, ro.filter_mean_low, ro.filter_mean_high),
        eval_prompts=lambda: task.prompts("test", cfg.task.test_size, cfg.seed),
        eval_params=SamplingParams(max_new_tokens=ro.max_new_tokens, temperature=cfg.eval.temperature, stop=stop,
                                   stop_token_ids=ends),
    )


def _episodes(cfg: RunConfig, hub: InferenceHub, tokenizer, policy, turns, index: int, workers: int) -> GroupProducer:
    from cadence.envs.runner import EnvRunner
    from cadence.rollout.episode_producer import EpisodeProducer
    from cadence.rollout.failures import Failures
    from cadence.rollout.lockstep import LockstepEpisodeProducer

    ro, env = cfg.rollout, cfg.env
    assert env is not None
    budget = _context_budget(cfg, policy)
    stop = list(ro.stop or [])
    kwargs: dict = {}
    if ro.env_mode == "lockstep":
        kwargs["batch_groups"] = worker_quotas(ro.prompts_per_step, workers)[index]
    return (LockstepEpisodeProducer if kwargs else EpisodeProducer)(
        hub, lambda: EnvRunner.from_config(env), tokenizer,
        SamplingParams(max_new_tokens=ro.max_new_tokens, temperature=ro.temperature, top_p=ro.top_p, stop=stop),
        ro.group_size, redundancy=ro.redundancy, max_context_tokens=budget, turns=turns,
        first_seed=1000 * (cfg.seed + 1) + 10**6 * index,
        eval_params=SamplingParams(max_new_tokens=ro.max_new_tokens, temperature=cfg.eval.temperature, stop=stop),
        eval_episodes=cfg.eval.episodes, **kwargs,
        failures=Failures(env.name, log=cfg.run_dir() / "env_errors.log"),
    )


def _context_budget(cfg: RunConfig, policy) -> int:
    """An episode never grows past the positions the model was built for (a tiny shipped model
    knows 1024): the budget is the smaller of the config's and the model's."""
    ro = cfg.rollout
    return min(ro.max_context_tokens, getattr(policy.config, "max_position_embeddings", None) or ro.max_context_tokens)


def _agent_runs(cfg: RunConfig, hub: InferenceHub, tokenizer, policy, index: int, workers: int) -> GroupProducer:
    """Groups of runs of the user's agent program, talking to the endpoint on this worker's hub
    (it starts on the hub's loop with the first run; cadence/agents/producer.py)."""
    from cadence.agents.config import resolve_agent
    from cadence.agents.endpoint import AgentEndpoint
    from cadence.agents.producer import AgentProducer, sandbox_and_grading
    from cadence.rollout.failures import AGENT_RUNS, Failures

    ro, agent = cfg.rollout, cfg.agent
    assert agent is not None
    endpoint = AgentEndpoint(
        hub, tokenizer, model_name=agent.endpoint.model_name, tool_format=agent.tool_format,
        max_tokens=ro.max_new_tokens, max_context_tokens=agent.endpoint.max_context_tokens or _context_budget(cfg, policy),
        max_n=agent.endpoint.max_n, max_tokens_limit=agent.endpoint.max_tokens_limit,
        max_body_mb=agent.endpoint.max_body_mb,
    )
    tasks, eval_tasks = agent_tasks(cfg, index, workers)
    return AgentProducer(
        endpoint, resolve_agent(agent.name), tasks, ro.group_size, eval_tasks, kwargs=agent.kwargs,
        timeout_s=agent.timeout_s, max_retries=agent.max_retries,
        failures=Failures(agent.name, AGENT_RUNS, cfg.run_dir() / "env_errors.log"), **sandbox_and_grading(agent),
    )


def agent_tasks(cfg: RunConfig, index: int = 0, workers: int = 1) -> tuple[Sequence, Sequence]:
    """(training tasks of worker `index`, held-out tasks): rows of the task.* dataset as dicts
    with its prompt and answer fields, or environment seeds (held-out ones never trained on)."""
    from cadence.rollout.episode_producer import HELD_OUT_SEED

    assert cfg.agent is not None
    if cfg.agent.tasks == "seeds":
        first = 1000 * (cfg.seed + 1) + 10**6 * index
        return range(first, HELD_OUT_SEED), range(HELD_OUT_SEED, HELD_OUT_SEED + cfg.eval.episodes)
    task, fields = build_task(cfg.task), (cfg.task.prompt_field or "prompt", cfg.task.answer_field or "answer")

    def rows(prompts: list) -> list[dict]:
        return [{**p.meta, fields[0]: p.text, fields[1]: p.answer} for p in prompts]

    train = rows(task.prompts("train", PROMPT_BLOCK, cfg.seed))[index::workers]
    return train, rows(task.prompts("test", cfg.task.test_size, cfg.seed))


def _length_sampler(cfg: RunConfig, index: int) -> Callable[[], int] | None:
    sim = cfg.rollout.simulate_lengths
    if sim is None:
        return None
    rng = random.Random(cfg.seed * 7919 + index)
    return lambda: max(1, min(sim.max_tokens, round(rng.lognormvariate(math.log(sim.median_tokens), sim.sigma))))
