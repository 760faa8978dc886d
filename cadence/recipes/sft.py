"""Supervised warm-up: teach a model a task's answer format from synthetic examples.

This recipe made the built-in model (`model.path=builtin`): a tiny Llama
trained from scratch on the arithmetic task for a few minutes, stopped early
on purpose so that RL has room to improve it. Regenerate it with
`cadence sft --config cadence/configs/sft_arith.yaml`.

With an `env` section the examples are a scripted expert's episodes in a
built-in environment (`cadence.envs.expert`), each one sequence laid out
exactly as an agentic rollout lays it out (`PlainTurns`, every reply ending in
EOS), with the loss on the replies only. That made `builtin:frozenlake`
(`cadence/configs/sft_frozenlake.yaml`).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any, Literal

import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from tqdm import tqdm

from cadence.config import ConfigError, _explain, apply_override, parse_override, read_yaml
from cadence.data.build import build_task
from cadence.data.config import TaskConfig
from cadence.envs.expert import Demonstration, demonstrations
from cadence.models.loading import load_policy, load_tokenizer
from cadence.models.tiny import char_tokenizer, tiny_model
from cadence.runtime.threads import configure_threads


class SFTModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str | None = Field(None, description="Start from this checkpoint; None = a new tiny model.")
    arch: Literal["llama", "qwen2"] = Field("llama", description="Architecture of a new tiny model.")
    hidden_size: int = Field(128, gt=0)
    layers: int = Field(4, gt=0)
    heads: int = Field(4, gt=0)
    max_positions: int = Field(512, gt=0, description="Longest sequence of a new tiny model (episodes are long).")


class SFTEnvConfig(BaseModel):
    """Demonstrations of a built-in environment's scripted expert as the SFT data."""

    model_config = ConfigDict(extra="forbid")
    name: Literal["frozenlake", "sokoban"] = Field(description="A built-in environment with a scripted expert.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Its constructor arguments.")
    max_turns: int = Field(10, gt=0, description="Longest demonstration, in turns.")
    slip: float = Field(
        0.0, ge=0, le=1, description="Share of turns where the demonstrator plays the environment's habitual "
        "mistake instead of the expert move (frozenlake: walking as if there were no holes)."
    )
    action_tag: str | None = Field(
        "answer", description="Replies as <tag>move</tag>; null: the bare move (train with env.action_tag=null)."
    )
    short_actions: bool = Field(False, description="Replies name a move by its first letter (D for Down).")
    turn_examples: bool = Field(
        False, description="Each turn is its own example, its observation alone as the prompt: short rows, "
        "many decisions per step (a first stage; the episodes as a rollout lays them out come after)."
    )
    first_seed: int = Field(
        10**8, ge=0, description="Demonstrations play seeds first_seed, first_seed+1, ...: neither RL's "
        "training seeds (from 1000) nor its held-out ones (from 10**9)."
    )


class SFTConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seed: int = 0
    model: SFTModelConfig = Field(default_factory=SFTModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    env: SFTEnvConfig | None = Field(None, description="Train on expert episodes in this environment, not on `task`.")
    examples: int = Field(20000, gt=0, description="Synthetic training examples (with `env`: demonstration episodes).")
    steps: int = Field(300, gt=0, description="Optimizer steps.")
    batch_size: int = Field(64, gt=0)
    group_by_length: bool = Field(
        False,
        description="Draw each batch from examples of similar length: far less padding when "
        "lengths are long-tailed ('chain'); off = uniformly random batches.",
    )
    lr: float = Field(3e-3, gt=0)
    output: str = Field("runs/sft", description="Folder for the trained checkpoint.")
    threads: int = Field(0, ge=0, description="torch threads; 0 = all cores.")


def load_sft_config(path: str | None, overrides: list[str]) -> SFTConfig:
    tree = read_yaml(path) if path else {}
    for text in overrides:
        apply_override(tree, *parse_override(text))
    try:
        return SFTConfig.model_validate(tree or {})
    except ValidationError as err:
        raise ConfigError(_explain(err, SFTConfig)) from None


def check_output(cfg: SFTConfig, overwrite: bool) -> None:
    """The rule `cadence train` follows too: results already on disk are never replaced silently."""
    out = Path(cfg.output)
    if out.is_file():
        raise ConfigError(f"output: {out} is a file; set output=<a folder>")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ConfigError(
            f"output: {out} already holds files (a model?); set output=<new folder>, or pass "
            "--overwrite to replace it"
        )


Row = tuple[list[int], list[int]]  # token ids, and 1 where the loss applies


def encode_examples(tokenizer, pairs: list[tuple[str, str]]) -> list[Row]:
    """Token ids of prompt + completion, the loss on the completion."""
    out = []
    for prompt, completion in pairs:
        p = tokenizer(prompt).input_ids
        c = tokenizer(completion, add_special_tokens=False).input_ids
        out.append((p + c, [0] * len(p) + [1] * len(c)))
    return out


def encode_episodes(tokenizer, demos: list[Demonstration]) -> list[Row]:
    """Each demonstration as the one sequence an agentic rollout trains on (`run_episode`):
    first observation, then reply + EOS (loss) and the next observation (no loss), turn by turn."""
    from cadence.rollout.turns import PlainTurns

    turns = PlainTurns()
    out = []
    for demo in demos:
        ids = turns.first(tokenizer, demo.turns[0].observation)
        mask = [0] * len(ids)
        reply: list[int] = []
        for k, turn in enumerate(demo.turns):
            if k > 0:
                obs = turns.after(tokenizer, reply, turn.observation)
                ids, mask = ids + obs, mask + [0] * len(obs)
            reply = tokenizer(turn.response, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
            ids, mask = ids + reply, mask + [1] * len(reply)
        out.append((ids, mask))
    return out


def encode_turns(tokenizer, demos: list[Demonstration]) -> list[Row]:
    """Every turn of every demonstration as its own row: the observation as a first turn, then reply + EOS."""
    from cadence.rollout.turns import PlainTurns

    out = []
    for turn in (t for demo in demos for t in demo.turns):
        prompt = PlainTurns().first(tokenizer, turn.observation)
        reply = tokenizer(turn.response, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        out.append((prompt + reply, [0] * len(prompt) + [1] * len(reply)))
    return out


def length_buckets(rows: list[Row], size: int) -> list[list[Row]]:
    """`rows` sorted by length and cut into batches of `size`: neighbours pad little."""
    ordered = sorted(rows, key=lambda row: len(row[0]))
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


def make_batch(rows: list[Row], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)  # the loss only where the row's mask is 1
    for i, (seq, mask) in enumerate(rows):
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
        labels[i, : len(seq)] = torch.where(torch.tensor(mask, dtype=torch.bool), ids[i, : len(seq)], -100)
    return ids, attn, labels


def fit(
    model: torch.nn.Module,
    data: list[Row],
    pad_id: int,
    rng: random.Random,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    group_by_length: bool = False,
) -> None:
    """The warm-up loop: AdamW, 20 warm-up steps then linear decay to 0, gradient clip 1.0.

    Batches are drawn with `rng`: uniformly, or (`group_by_length`) a bucket of
    neighbours in length.
    """
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 20) * (1 - i / steps))
    buckets = length_buckets(data, batch_size) if group_by_length else None
    bar = tqdm(range(steps), desc="sft", dynamic_ncols=True)
    for _ in bar:
        rows = rng.choice(buckets) if buckets else rng.sample(data, batch_size)
        ids, attn, labels = make_batch(rows, pad_id)
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")


def training_rows(cfg: SFTConfig, tokenizer) -> list[Row]:
    """The task's synthetic examples, or (`env`) the expert's episodes."""
    if cfg.env is not None:
        e = cfg.env
        seeds = range(e.first_seed, e.first_seed + cfg.examples)
        demos = demonstrations(e.name, seeds, e.kwargs, e.max_turns, e.slip, e.action_tag, e.short_actions)
        return (encode_turns if e.turn_examples else encode_episodes)(tokenizer, demos)
    task = build_task(cfg.task)
    if not hasattr(task, "sft_examples"):
        raise ConfigError(f"task {cfg.task.name!r} has no synthetic SFT examples; use 'arith' or 'chain'")
    return encode_examples(tokenizer, task.sft_examples(cfg.examples, cfg.seed))


def sft(cfg: SFTConfig) -> Path:
    configure_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    if cfg.env is None:
        build_task(cfg.task)  # data problems show before a model loads
    if cfg.model.path:
        tokenizer, model = load_tokenizer(cfg.model.path), load_policy(cfg.model.path)
    else:
        tokenizer = char_tokenizer()
        model = tiny_model(
            cfg.model.arch, cfg.seed, hidden_size=cfg.model.hidden_size, layers=cfg.model.layers,
            heads=cfg.model.heads, max_positions=cfg.model.max_positions,
        ).train()
    data = training_rows(cfg, tokenizer)
    start = time.perf_counter()
    fit(
        model, data, tokenizer.pad_token_id, random.Random(cfg.seed),
        steps=cfg.steps, lr=cfg.lr, batch_size=cfg.batch_size, group_by_length=cfg.group_by_length,
    )
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "sft_config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    print(f"saved {out} after {cfg.steps} steps in {time.perf_counter() - start:.0f} s")
    return out
