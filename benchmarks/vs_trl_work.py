"""The identical work of benchmarks/vs_trl.py: settings, and each system's view of them.

A `Setting` is the task, token budget, steps and start model that TRL and
cadence both train on; the functions here turn one into cadence overrides
(`cadence_overrides`), TRL's `GRPOConfig` arguments (`trl_settings`), TRL's
dataset (`train_prompts`, in cadence's own prompt order) and reward function
(`make_trl_reward`, cadence's verifier), and the shared evaluator
(`held_out_accuracy`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SFT_CACHE = ROOT / "runs" / "bench-vs-trl"  # warmed-up start models, made once and reused

PROMPTS_PER_STEP = 16
GROUP_SIZE = 8
BATCH = PROMPTS_PER_STEP * GROUP_SIZE  # completions per optimizer step
TEMPERATURE = 1.0
MICRO_BATCH = 64  # cadence's default trainer.micro_batch_size; TRL's per-device batch
TEST_PROMPTS = 200
SEED = 0


@dataclass(frozen=True)
class Setting:
    """One piece of identical work for the three runs: task, answer budget, steps, start model."""

    name: str
    task: tuple[str, ...]  # cadence overrides naming the task; reward and stop follow from it
    max_new_tokens: int
    steps: int  # optimizer steps of a full run
    sft_config: str | None  # how the start model is made; None: the built-in model
    about: str


SETTINGS = {
    "arith": Setting(
        "arith", (), 8, 60, None,
        "the default task: 3-token answers, compute-bound (forward + backward dominate)",
    ),
    "chain": Setting(
        "chain", ("task.name=chain",), 352, 30, "cadence/configs/sft_chain.yaml",
        "addition chains: long-tailed answers (median ~24 tokens, longest ~330), generation-heavy",
    ),
}


def setting_config(setting: Setting, model: str) -> Any:
    """cadence's config for `setting` with everything else at its defaults."""
    from cadence.config import load_config

    return load_config(None, [f"model.path={model}", *setting.task])


def prepare_model(setting: Setting, cache: Path = SFT_CACHE, sft_overrides: Sequence[str] = ()) -> str:
    """The start model of `setting`: the built-in one, or its SFT warm-up (made once, then reused)."""
    if setting.sft_config is None:
        return "builtin"
    out = cache / f"sft-{setting.name}"
    if not (out / "sft_config.yaml").is_file():
        from cadence.recipes.sft import load_sft_config, sft

        print(f"[vs_trl] {setting.name}: warm-up SFT ({setting.sft_config}) -> {out}", flush=True)
        sft(load_sft_config(str(ROOT / setting.sft_config), [*sft_overrides, f"output={out}"]))
    return str(out)


# ----------------------------------------------------------------------------- shared pieces


def make_trl_reward(cfg: Any, task: Any | None = None) -> Callable[..., list[float]]:
    """A TRL reward function that scores with cadence's own verifier.

    It builds the reward cadence's config `cfg` builds for its task
    (``reward.name=auto``: ``exact_match`` on the first line for ``arith``, on
    the last number of the first line for ``chain``)
    and calls it on each (prompt, completion, answer), exactly as cadence's
    rollout does. TRL passes dataset columns as keyword arguments, so the
    dataset carries an ``answer`` column.
    """
    from cadence.data.build import build_task
    from cadence.data.tasks import Prompt
    from cadence.rewards.build import build_reward

    verifier = build_reward(cfg.reward, task if task is not None else build_task(cfg.task))

    def cadence_exact_match(
        prompts: list[str], completions: list[str], answer: list[str], **_: Any
    ) -> list[float]:
        return [
            float(verifier(Prompt(id=f"trl-{i}", text=p, answer=a), c))
            for i, (p, c, a) in enumerate(zip(prompts, completions, answer, strict=True))
        ]

    return cadence_exact_match


def train_prompts(cfg: Any, steps: int) -> list[Any]:
    """The prompts cadence's sync run trains on, in the order it draws them.

    The rollout worker asks the task for ``steps x prompts_per_step`` training
    prompts and walks them through a `PromptStream` seeded with the run seed;
    TRL gets that sequence with its own shuffling off.
    """
    from cadence.data.build import build_task
    from cadence.rollout.prompts import PromptStream

    n = steps * PROMPTS_PER_STEP
    stream = PromptStream(build_task(cfg.task).prompts("train", n, SEED), SEED)
    return [stream.at(position) for position in range(n)]


def held_out_accuracy(setting: Setting, model_path: str, threads: int) -> float:
    """cadence's greedy pass@1 on the task's first 200 test prompts (`cadence eval`)."""
    from cadence.config import load_config
    from cadence.recipes.evaluate import run_eval

    cfg = load_config(
        None,
        [
            f"model.path={model_path}",
            *setting.task,
            f"seed={SEED}",
            f"task.test_size={TEST_PROMPTS}",
            f"rollout.max_new_tokens={setting.max_new_tokens}",
            "eval.temperature=0",
            "eval.samples=1",
            f"runtime.threads={threads}",
        ],
    )
    return run_eval(cfg).pass_at_1


def cadence_overrides(kind: str, setting: Setting, model: str, steps: int, run_dir: str, cpus: int) -> list[str]:
    """`cadence train` overrides of the sync or async run."""
    common = [
        f"model.path={model}",
        *setting.task,
        f"seed={SEED}",
        f"trainer.steps={steps}",
        f"rollout.prompts_per_step={PROMPTS_PER_STEP}",
        f"rollout.group_size={GROUP_SIZE}",
        f"rollout.max_new_tokens={setting.max_new_tokens}",
        f"rollout.temperature={TEMPERATURE}",
        f"trainer.micro_batch_size={MICRO_BATCH}",
        "algorithm.kl.coef=0",
        "eval.before=false",
        "eval.after=false",  # every run is scored by the same evaluator afterwards
        "eval.every=0",
        "logging.progress=false",
        "logging.tensorboard=false",
        "checkpoint.every=0",  # only the final weights are saved
        f"logging.run_dir={run_dir}",
    ]
    if kind == "cadence-sync":
        return [*common, "runtime.kind=inline", f"runtime.threads={cpus}", "rollout.async_ratio=0"]
    if kind == "cadence-async":
        rollout_cpus = max(1, cpus // 2)
        return [
            *common,
            "runtime.kind=ray",
            f"runtime.threads={max(1, cpus - rollout_cpus)}",
            f"runtime.rollout_cpus={rollout_cpus}",
            "rollout.async_ratio=2",
        ]
    raise ValueError(f"not a cadence run: {kind!r}")


def trl_settings(setting: Setting, steps: int, output_dir: str, continuous: bool = False) -> dict[str, Any]:
    """GRPOConfig keyword arguments matched to cadence's defaults (see docs/vs_trl.md)."""
    from cadence.config import RunConfig

    defaults = RunConfig()
    return {
        "output_dir": output_dir,
        "max_steps": steps,
        # One optimizer step = one generation batch of 16 prompts x 8 = 128 completions,
        # trained in two micro-batches of 64 (cadence's trainer.micro_batch_size).
        "per_device_train_batch_size": MICRO_BATCH,
        "gradient_accumulation_steps": BATCH // MICRO_BATCH,
        "generation_batch_size": BATCH,
        "num_generations": GROUP_SIZE,
        "num_iterations": 1,
        "max_completion_length": setting.max_new_tokens,
        "temperature": TEMPERATURE,
        "top_p": defaults.rollout.top_p,
        "top_k": 0,
        # cadence's default GRPO: PPO clip eps 0.2, group-std-normalised advantages,
        # per-token losses averaged over every token of the 128-completion batch ("dapo").
        "loss_type": "dapo",
        "scale_rewards": "group",
        "epsilon": defaults.algorithm.eps_low,
        "epsilon_high": defaults.algorithm.eps_high,
        "beta": defaults.algorithm.kl.coef,
        "learning_rate": defaults.trainer.lr,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "weight_decay": defaults.trainer.weight_decay,
        "adam_beta1": defaults.trainer.betas[0],
        "adam_beta2": defaults.trainer.betas[1],
        "max_grad_norm": defaults.trainer.grad_clip,
        "use_vllm": False,
        # trl-cb: transformers' paged continuous batching (`generate_batch`) instead of one
        # static `generate` call; the default is off.
        "use_transformers_continuous_batching": continuous,
        "bf16": False,
        "fp16": False,
        "use_cpu": True,
        "gradient_checkpointing": False,  # TRL defaults to True; cadence does not checkpoint
        "model_init_kwargs": {"dtype": "float32"},
        "shuffle_dataset": False,  # the dataset is already in cadence's prompt order
        "seed": SEED,
        "logging_steps": 1,
        "eval_strategy": "no",
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }
