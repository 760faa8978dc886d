"""`cadence rhythm`: see which tokens of one response attention-rhythm credit amplifies.

Takes one response, either generated here from a prompt or read from a saved
rollout record, runs the eager-attention copy of the policy over prompt +
response (`cadence.models.attention.ActorAttention`, SPEC section 3) and plots
its WAAD, FAI and gamma curves with `cadence.observe.rhythm_plot`.

Rollout record format (JSON lines, one record per line, blank lines skipped;
a file holding one pretty-printed JSON object, or a JSON list of objects, is
read too). Each record has either token ids or text:

    {"prompt_ids": [20, 21, 14], "response_ids": [28, 202, 2]}
    {"prompt": "12+7=", "response": "19\\n"}

- `prompt_ids` / `response_ids`: lists of token ids of the checkpoint's
  tokenizer, exactly as the policy saw and produced them (the response may
  end with EOS). They win when a record has both ids and text.
- `prompt` / `response`: text, tokenized like the rollout does
  (`tokenizer(prompt).input_ids`, then the response with
  `add_special_tokens=False`). Byte-level re-tokenisation of sampled text is
  not always the sampled ids, so ids are the faithful form.
- `loss_mask` (optional): one 0/1 per response token, 0 on an agentic
  episode's observations, as the run's samples.jsonl writes it; only tokens
  with 1 are ranked for credit, as in training.
- Any other fields (reward, advantage, step, ...) are ignored;
  `rollout_record` builds a record for writers such as the trainer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from cadence.algo.rhythm import CreditMode, RhythmConfig
from cadence.config import ConfigError, _explain, parse_override

CREDIT_MODES = ("local", "global", "coupled")


# ----------------------------------------------------------------------------
# Inputs


def check_credit(credit: str) -> CreditMode:
    """The `--credit` mode, checked (`none` would have nothing to show)."""
    if credit not in CREDIT_MODES:
        raise ConfigError(f"--credit must be one of {', '.join(CREDIT_MODES)}, got {credit!r}")
    return credit


def rhythm_config(overrides: list[str] | None = None) -> RhythmConfig:
    """RhythmConfig from `key=value` constants (values parsed as YAML)."""
    values: dict[str, Any] = {}
    for text in overrides or []:
        path, value = parse_override(text)
        if len(path) != 1:
            raise ConfigError(f"rhythm constant {text!r}: keys have no sections (e.g. window=5)")
        if path[0] == "credit":
            raise ConfigError("set the credit mode with --credit, not credit=")
        values[path[0]] = value
    try:
        return RhythmConfig(**values)
    except ValidationError as err:
        raise ConfigError(
            _explain(err, RhythmConfig).replace("invalid config:", "invalid rhythm constants:", 1)
        ) from None


def unescape(text: str) -> str:
    r"""Turn the escapes \n, \t and \\ typed on a command line into characters."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in "nt\\":
            out.append({"n": "\n", "t": "\t", "\\": "\\"}[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def rollout_record(prompt_ids: list[int], response_ids: list[int], **extra: Any) -> dict[str, Any]:
    """One rollout record (see the module docstring); `extra` fields are kept but not read."""
    return {
        "prompt_ids": [int(t) for t in prompt_ids],
        "response_ids": [int(t) for t in response_ids],
        **extra,
    }


def read_rollout_records(path: str | Path) -> list[dict[str, Any]]:
    """All records of a rollout file: JSON lines, or one JSON object / list of objects."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"rollout file {p} does not exist")
    text = p.read_text(encoding="utf-8")
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if whole is not None:
        records = whole if isinstance(whole, list) else [whole]
        where = [f"{p} record {i}" for i in range(len(records))]
    else:
        records, where = [], []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ConfigError(f"{p} line {n}: not JSON ({err.msg})") from None
            where.append(f"{p} line {n}")
    for rec, loc in zip(records, where, strict=True):
        if not isinstance(rec, dict):
            raise ConfigError(f"{loc}: a record must be a JSON object, got {type(rec).__name__}")
    if not records:
        raise ConfigError(f"rollout file {p} holds no records")
    return records


def record_ids(
    record: dict[str, Any], tokenizer, where: str = "record"
) -> tuple[list[int], list[int]]:
    """(prompt_ids, response_ids) of a record, tokenizing text fields when it has no ids."""
    if "prompt_ids" in record or "response_ids" in record:
        ids = []
        for key in ("prompt_ids", "response_ids"):
            value = record.get(key)
            if not isinstance(value, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in value
            ):
                raise ConfigError(f"{where}: {key} must be a list of token ids (integers)")
            ids.append(value)
        prompt_ids, response_ids = ids
    elif "prompt" in record or "response" in record:
        for key in ("prompt", "response"):
            if not isinstance(record.get(key), str):
                raise ConfigError(f"{where}: {key} must be a string")
        prompt_ids = list(tokenizer(record["prompt"]).input_ids)
        response_ids = list(tokenizer(record["response"], add_special_tokens=False).input_ids)
    else:
        raise ConfigError(
            f"{where}: needs prompt_ids and response_ids (token ids) or prompt and response "
            f"(text); has {', '.join(sorted(record)) or 'no fields'}"
        )
    if not prompt_ids:
        raise ConfigError(f"{where}: the prompt is empty")
    if not response_ids:
        raise ConfigError(f"{where}: the response is empty")
    return prompt_ids, response_ids


def record_loss_mask(record: dict[str, Any], n_response: int, where: str = "record") -> list[int] | None:
    """A record's `loss_mask` (1 on the model's tokens, 0 on an episode's observations), if any."""
    mask = record.get("loss_mask")
    if mask is None:
        return None
    if not isinstance(mask, list) or len(mask) != n_response or any(m not in (0, 1) for m in mask):
        raise ConfigError(f"{where}: loss_mask must be a list of {n_response} zeros and ones, one per response token")
    return [int(m) for m in mask]


# ----------------------------------------------------------------------------
# The run


@dataclass
class RhythmResult:
    """One response's rhythm credit and where its plot went."""

    prompt: str
    prompt_ids: list[int]
    response_ids: list[int]
    labels: list[str]
    gamma: torch.Tensor
    info: dict[str, Any]
    credit: CreditMode
    cfg: RhythmConfig
    out: Path
    notes: list[str] = field(default_factory=list)

    @property
    def amplified_frac(self) -> float:
        return float((self.gamma > 1.0).float().mean())

    @property
    def gamma_mean(self) -> float:
        return float(self.gamma.float().mean())

    def summary(self) -> str:
        return (
            f"{len(self.response_ids)} response tokens, credit {self.credit}: "
            f"{self.amplified_frac:.1%} amplified, mean gamma {self.gamma_mean:.3f}"
        )


def default_stop(checkpoint: str) -> list[str]:
    """The stop strings of the task the checkpoint learned, read from the config it was trained
    with (`run_config.yaml` of a `cadence train` checkpoint, `sft_config.yaml` of a `cadence sft`
    one): arith and chain answers end at a newline, so the built-in model's response is its answer,
    not the answer and 120 tokens of filler. Anything else stops at EOS alone."""
    import yaml

    from cadence.data.arithmetic import TERMINATOR
    from cadence.models.loading import resolve_model_path

    folder = resolve_model_path(checkpoint)
    for name in ("run_config.yaml", "sft_config.yaml"):
        if (folder / name).is_file():
            tree = yaml.safe_load((folder / name).read_text()) or {}
            task = (tree.get("task") or {}).get("name", "arith")
            return [TERMINATOR] if not tree.get("env") and task in ("arith", "chain") else []
    return []


def generate_response(
    policy,
    tokenizer,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float,
    stop: list[str] | None = None,
    seed: int = 0,
) -> list[int]:
    """Sample one response with the embedded engine (temperature 0: greedy)."""
    from cadence.inference.embedded import EmbeddedEngine
    from cadence.inference.types import GenRequest, SamplingParams
    from cadence.models.loading import frozen_copy

    try:
        params = SamplingParams(
            max_new_tokens=max_new_tokens, temperature=temperature, stop=list(stop or [])
        )
    except ValueError as err:
        raise ConfigError(str(err)) from None
    engine = EmbeddedEngine(frozen_copy(policy), tokenizer, max_batch_size=1, seed=seed)
    (result,) = engine.generate([GenRequest("rhythm", list(prompt_ids), params)])
    return list(result.token_ids)


def run_rhythm(
    checkpoint: str,
    prompt: str | None = None,
    rollout: str | Path | None = None,
    index: int = 0,
    credit: str = "coupled",
    overrides: list[str] | None = None,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    stop: list[str] | None = None,
    out: str | Path = "rhythm.png",
    seed: int = 0,
    threads: int = 0,
) -> RhythmResult:
    """Generate (or read) one response, compute its rhythm credit, write the PNG.

    Exactly one of `prompt` and `rollout` is given. Problems a user can fix
    (paths, record format, constants) raise ConfigError before any model loads
    where possible.
    """
    from cadence.models.attention import ActorAttention
    from cadence.models.loading import load_policy, load_tokenizer, model_path_problem
    from cadence.observe.rhythm_plot import plot_rhythm, token_labels
    from cadence.runtime.threads import configure_threads

    if (prompt is None) == (rollout is None):
        raise ConfigError("give a PROMPT or --from-rollout FILE (exactly one)")
    credit = check_credit(credit)
    cfg = rhythm_config(overrides)
    problem = model_path_problem(checkpoint)
    if problem is not None:
        raise ConfigError(f"checkpoint {checkpoint!r}: {problem}")
    record = None
    if rollout is not None:
        records = read_rollout_records(rollout)
        if not -len(records) <= index < len(records):
            raise ConfigError(
                f"--index {index}: {rollout} holds {len(records)} record(s) (0..{len(records) - 1})"
            )
        record = records[index]
    out = Path(out).expanduser()
    if out.exists() and out.is_dir():
        raise ConfigError(f"--out {out} is a folder; give a file name such as {out / 'rhythm.png'}")

    configure_threads(threads)
    tokenizer = load_tokenizer(checkpoint)
    loss_mask = None
    if record is not None:  # the record's own problems, before the (slow) policy load
        prompt_ids, response_ids = record_ids(record, tokenizer, f"{rollout} record {index}")
        loss_mask = record_loss_mask(record, len(response_ids), f"{rollout} record {index}")
    policy = load_policy(checkpoint)
    notes: list[str] = []
    if record is not None:
        vocab = policy.config.vocab_size
        bad = [t for t in prompt_ids + response_ids if not 0 <= t < vocab]
        if bad:
            raise ConfigError(
                f"{rollout} record {index}: token id {bad[0]} outside the checkpoint's "
                f"vocabulary (0..{vocab - 1}); was it written with another tokenizer?"
            )
        prompt_text = tokenizer.decode(prompt_ids, skip_special_tokens=True)
    else:
        prompt_text = prompt
        prompt_ids = list(tokenizer(prompt).input_ids)
        if not prompt_ids:
            raise ConfigError("the prompt is empty")
        if stop is None:
            stop = default_stop(checkpoint)
            if stop:
                notes.append(f"the response stops at {stop[0]!r}, the checkpoint's task's stop string "
                             "(--stop to give others)")
        response_ids = generate_response(
            policy, tokenizer, prompt_ids, max_new_tokens, temperature, stop, seed
        )

    actor = ActorAttention(policy, layers=cfg.layers)
    del policy
    gamma, info = actor.token_credit(
        torch.tensor(prompt_ids, dtype=torch.long),
        torch.tensor(response_ids, dtype=torch.long),
        credit,
        cfg,
        loss_mask=None if loss_mask is None else torch.tensor(loss_mask),
    )
    if len(response_ids) <= cfg.fai_min:
        notes.append(
            f"FAI is 0 everywhere: the response has {len(response_ids)} tokens and FAI needs "
            f"tokens at least fai_min={cfg.fai_min} positions later"
        )
    labels = token_labels(tokenizer, response_ids)
    result = RhythmResult(
        prompt=prompt_text,
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        labels=labels,
        gamma=gamma,
        info=info,
        credit=credit,
        cfg=cfg,
        out=out,
        notes=notes,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    plot_rhythm(out, labels, gamma, info, credit, cfg, prompt=prompt_text, checkpoint=checkpoint)
    return result
