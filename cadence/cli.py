"""The `cadence` command: train, sft, eval, algorithms.

Every command takes an optional YAML file and `key.sub=value` overrides, e.g.
`cadence train trainer.steps=50 rollout.group_size=4`.
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Annotated

import typer

from cadence.config import ConfigError, RunConfig, load_config
from cadence.sandbox.cli import app as sandbox_app
from cadence.simulate.cli import app as simulate_app

app = typer.Typer(add_completion=False, no_args_is_help=True, help="cadence: RL post-training for LLMs.")
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(simulate_app, name="simulate")

ConfigOpt = Annotated[str | None, typer.Option("--config", "-c", help="YAML config file.")]
Overrides = Annotated[list[str] | None, typer.Argument(help="Overrides like trainer.lr=3e-4.")]


def _fail(err: Exception) -> None:
    typer.secho(str(err), fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _note(text: str) -> None:
    typer.secho(f"note: {text}", fg=typer.colors.YELLOW, err=True)


def eval_notes(cfg: RunConfig) -> list[str]:
    """Settings that are valid but do not do what they look like they do."""
    notes = []
    k = cfg.eval.samples
    if k > 1 and cfg.eval.temperature == 0:
        notes.append(
            f"eval.samples={k} at eval.temperature=0 repeats one greedy answer {k} times, so "
            f"pass@{k} = pass@1; set eval.temperature=1.0 for a real pass@{k}"
        )
    return notes


def _quiet_library_bars() -> None:
    """No weight-loading or shard-writing bars from transformers: they interleaved with the
    training bar. Through the environment, so child processes and Ray actors stay quiet too
    (a value the user set is kept)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:  # imported before the variable was read
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def _resume_command(cfg: RunConfig) -> str:
    """The command line that continues this run: the same arguments, plus --resume (and the run's
    name when it was chosen by start time, so a later run cannot become "the latest")."""
    args = sys.argv[1:]
    chosen = "{name}" in cfg.logging.run_dir and not any(a.startswith("logging.name=") for a in args)
    named = [f"logging.name={cfg.logging.name}"] if chosen else []
    return shlex.join(["cadence", *args, *named, *([] if "--resume" in args else ["--resume"])])


@app.command()
def train(
    overrides: Overrides = None,
    config: ConfigOpt = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the run's last checkpoint.")] = False,
    allow_change: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-change",
            help="With --resume: config fields that may differ from the checkpoint's (comma-separated, "
            "e.g. trainer.steps,trainer.lr; a section name allows all its fields). Recorded in "
            "the run folder's resume_changes.yaml.",
        ),
    ] = None,
) -> None:
    """Train a policy with RL on verifiable rewards (default: built-in model, arithmetic)."""
    from cadence.train.resume import split_allow

    if allow_change and not resume:
        _fail(ConfigError("--allow-change only applies with --resume"))
    _quiet_library_bars()
    from cadence.observe.run_name import choose_run_name, named_explicitly

    try:
        cfg = load_config(config, overrides)
        auto_name = not named_explicitly(cfg.logging)
        choose_run_name(cfg.logging, resume)
    except ConfigError as err:
        _fail(err)
    for note in eval_notes(cfg):
        _note(note)
    if resume and auto_name:
        typer.echo(f"resuming the latest run: {cfg.run_dir()}")
    from cadence.runtime.supervisor import CHILD_ENV, supervise

    if cfg.runtime.max_restarts > 0 and not os.environ.get(CHILD_ENV):
        # Unattended: a parent process that resumes the run from its last checkpoint when it dies;
        # its children get the run's name, so each restart continues this run, not a new one.
        args = [*(["--config", config] if config else []), *(overrides or []),
                *([f"logging.name={cfg.logging.name}"] if auto_name else []),
                *(f"--allow-change={a}" for a in allow_change or [])]
        raise typer.Exit(supervise(cfg.runtime, cfg.logging, args, resume))
    from cadence.recipes.train_rlvr import TrainingInterrupted
    from cadence.recipes.train_rlvr import train as run_train

    try:
        run_train(cfg, resume=resume, allow_change=split_allow(allow_change))
    except ConfigError as err:
        _fail(err)
    except TrainingInterrupted as stop:
        if stop.checkpoint is None:
            saved = f"no checkpoint yet (checkpoint.every={cfg.checkpoint.every})"
        else:
            saved = f"checkpoint {stop.checkpoint[1]} (step {stop.checkpoint[0]})"
        typer.secho(
            f"interrupted after step {stop.step}; saved: {saved}, metrics to step {stop.step} in "
            f"{stop.run_dir / 'metrics.jsonl'}. Continue with: {_resume_command(cfg)}",
            fg=typer.colors.YELLOW,
            err=True,
        )
        raise typer.Exit(130) from None


@app.command()
def sft(
    overrides: Overrides = None,
    config: ConfigOpt = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace a model already in the output folder.")
    ] = False,
) -> None:
    """Supervised warm-up on a task's synthetic examples (made the built-in model)."""
    from cadence.recipes.sft import check_output, load_sft_config
    from cadence.recipes.sft import sft as run_sft

    _quiet_library_bars()

    try:
        cfg = load_sft_config(config, overrides or [])
        check_output(cfg, overwrite)
        run_sft(cfg)
    except ConfigError as err:
        _fail(err)


@app.command("eval")
def eval_(
    checkpoint: Annotated[str, typer.Argument(help="Checkpoint folder, or 'builtin'.")],
    overrides: Overrides = None,
    config: ConfigOpt = None,
) -> None:
    """Held-out accuracy (pass@1, pass@k with eval.samples=k) of a checkpoint; held-out success of
    its episodes with env.* or agent.* (as `cadence train` evaluates them)."""
    try:
        cfg = load_config(config, [*(overrides or []), f"model.path={checkpoint}"])
    except ConfigError as err:
        _fail(err)
    for note in eval_notes(cfg):
        _note(note)
    from cadence.recipes.evaluate import run_eval

    try:
        result = run_eval(cfg)
    except ConfigError as err:
        _fail(err)
    at_k = f"  pass@{result.k} {result.pass_at_k:.3f}" if result.k > 1 else ""
    episodes = cfg.run_kind.plays_episodes
    canaries = (f"  canary pass rate {result.canary_pass_rate:.3f} ({result.canaries} canary runs)"
                if result.canary_pass_rate is not None else "")
    typer.echo(
        f"{checkpoint}: {'held-out success' if episodes else 'pass@1'} {result.pass_at_1:.3f}{at_k}  "
        f"mean reward {result.mean_reward:.3f}  ({result.prompts} held-out {'episodes' if episodes else 'prompts'})"
        f"{canaries}"
    )


@app.command()
def export(
    source: Annotated[str, typer.Argument(help="A run folder (its latest checkpoint) or a checkpoint folder.")],
    out: Annotated[str, typer.Argument(help="New folder for the Hugging Face weights and tokenizer.")],
    dtype: Annotated[str, typer.Option("--dtype", help="float32, bfloat16 or float16.")] = "float32",
) -> None:
    """Write a checkpoint as plain Hugging Face weights (a LoRA run's adapter merged into its base)."""
    from pathlib import Path

    from cadence.models.loading import DTYPES
    from cadence.train.export import export_merged

    _quiet_library_bars()
    if dtype not in DTYPES:
        _fail(ConfigError(f"--dtype {dtype}: choose one of {', '.join(DTYPES)}"))
    try:
        folder = export_merged(Path(source), Path(out), dtype)
    except ValueError as err:
        _fail(err)
    typer.echo(f"wrote {out} from {folder} (loads with AutoModelForCausalLM.from_pretrained)")


@app.command()
def algorithms() -> None:
    """List policy losses and advantage estimators, one line each."""
    from cadence.algo import advantages, losses, mismatch

    typer.echo("policy losses (algorithm.loss=NAME):")
    for name, line in losses.describe().items():
        typer.echo(f"  {name:<16} {line}")
    typer.echo("advantage estimators (algorithm.advantage=NAME):")
    for name, line in advantages.describe().items():
        typer.echo(f"  {name:<16} {line}")
    typer.echo("off-policy corrections (algorithm.mismatch.mode=NAME; those that weight, not with losses weighted by mu):")
    for name, line in mismatch.MODES.items():
        typer.echo(f"  {name:<16} {line}")


@app.command()
def envs() -> None:
    """List the built-in environments (env.name=NAME), one line each."""
    from cadence.envs.registry import envs_command

    envs_command()


@app.command()
def rhythm(
    checkpoint: Annotated[str, typer.Argument(help="Checkpoint folder, or 'builtin'.")],
    args: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="PROMPT KEY=VALUE",
            help="The prompt to complete (left out with --from-rollout), then rhythm constants "
            "of RhythmConfig such as window=5 top_q=0.3 gamma_amp=2 tau_waad=median.",
        ),
    ] = None,
    from_rollout: Annotated[
        str | None,
        typer.Option(
            "--from-rollout",
            help="Read the response from a rollout file instead of generating one: JSON lines, "
            "each with prompt_ids and response_ids (token ids) or prompt and response (text).",
        ),
    ] = None,
    index: Annotated[int, typer.Option("--index", help="Which record of --from-rollout (0-based).")] = 0,
    credit: Annotated[str, typer.Option("--credit", help="local, global or coupled.")] = "coupled",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Longest response generated.")] = 128,
    temperature: Annotated[float, typer.Option("--temperature", help="Sampling temperature; 0 is greedy.")] = 0.0,
    stop: Annotated[
        list[str] | None,
        typer.Option("--stop", help="Stop string ending the response (repeatable; \\n and \\t are understood); "
                     "default: the stop string of the checkpoint's task (a newline for arith and chain)."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Sampling seed.")] = 0,
    out: Annotated[str, typer.Option("--out", "-o", help="Where the PNG goes.")] = "rhythm.png",
    threads: Annotated[int, typer.Option("--threads", help="torch threads (0: this process's share).")] = 0,
) -> None:
    """Plot one response's WAAD and FAI curves and the tokens attention-rhythm credit amplifies."""
    from cadence.recipes.rhythm import run_rhythm, unescape

    rest = list(args or [])
    prompt = None if from_rollout is not None or not rest else rest.pop(0)
    try:
        result = run_rhythm(
            checkpoint,
            prompt=prompt,
            rollout=from_rollout,
            index=index,
            credit=credit,
            overrides=rest,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            stop=None if stop is None else [unescape(s) for s in stop],  # None: the checkpoint task's
            out=out,
            seed=seed,
            threads=threads,
        )
    except ConfigError as err:
        _fail(err)
    for note in result.notes:
        typer.secho(f"note: {note}", fg=typer.colors.YELLOW, err=True)
    typer.echo(f"wrote {result.out}")
    typer.echo(result.summary())


@app.command()
def dashboard(
    runs: Annotated[str, typer.Option("--runs", help="Folder of run folders.")] = "runs",
    port: Annotated[int, typer.Option("--port", help="Port to serve on.")] = 8484,
    host: Annotated[
        str, typer.Option("--host", help="Address to bind; anything but 127.0.0.1 needs the printed token.")
    ] = "127.0.0.1",
    sandbox: Annotated[
        list[str] | None, typer.Option("--sandbox", help="A sandbox service URL to show (repeatable).")
    ] = None,
    sandbox_token: Annotated[
        str | None, typer.Option("--sandbox-token", help="Its token (default: $CADENCE_SANDBOX_TOKEN or its token file).")
    ] = None,
    allow_host: Annotated[
        list[str] | None, typer.Option("--allow-host", help="Another name the page may be opened by, e.g. a DNS "
                                       "name of this machine (repeatable; '*': any). Others get 421.")
    ] = None,
) -> None:
    """A web page of runs (live charts, the async pipeline, samples and episodes) and sandboxes."""
    from cadence.dashboard.serve import serve

    serve(runs, host, port, sandbox, sandbox_token, allow_hosts=allow_host)


@app.command("serve")
def serve_(
    model: Annotated[str, typer.Argument(help="A local Hugging Face checkpoint folder, or 'builtin'.")] = "builtin",
    port: Annotated[int, typer.Option("--port", help="Port on 127.0.0.1 (0: any free port).")] = 8000,
    tool_format: Annotated[
        str, typer.Option("--tool-format", help="auto (from the chat template), hermes, llama3 or none.")
    ] = "auto",
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Default max_tokens of a request.")] = 256,
    max_batch_size: Annotated[int, typer.Option("--max-batch-size", help="Sequences decoded together.")] = 32,
    seed: Annotated[int, typer.Option("--seed", help="Sampling seed.")] = 0,
    max_n: Annotated[int, typer.Option("--max-n", min=1, help="Choices one request may ask for (n).")] = 16,
    max_tokens_limit: Annotated[
        int | None, typer.Option("--max-tokens-limit", min=1, help="The largest max_tokens a request may ask for "
                                 "(default: the model's context).")
    ] = None,
    max_body_mb: Annotated[int, typer.Option("--max-body-mb", min=1, help="Larger request bodies get 413.")] = 8,
) -> None:
    """Serve a checkpoint on an OpenAI-compatible endpoint (agents' evaluation and debugging)."""
    from cadence.agents.serve import serve_model

    _quiet_library_bars()
    try:
        serve_model(model, port, tool_format, max_tokens, max_batch_size, seed, announce=typer.echo, max_n=max_n,
                    max_tokens_limit=max_tokens_limit, max_body_mb=max_body_mb)
    except ConfigError as err:
        _fail(err)


def main() -> None:  # pragma: no cover - entry point for `python -m cadence`
    sys.exit(app())
