"""The `cadence` command: train, sft, eval, algorithms.

Every command takes an optional YAML file and `key.sub=value` overrides, e.g.
`cadence train trainer.steps=50 rollout.group_size=4`.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from cadence.config import ConfigError, load_config

app = typer.Typer(add_completion=False, no_args_is_help=True, help="cadence: RL post-training for LLMs.")

ConfigOpt = Annotated[str | None, typer.Option("--config", "-c", help="YAML config file.")]
Overrides = Annotated[list[str] | None, typer.Argument(help="Overrides like trainer.lr=3e-4.")]


def _fail(err: Exception) -> None:
    typer.secho(str(err), fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


@app.command()
def train(
    overrides: Overrides = None,
    config: ConfigOpt = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the run's last checkpoint.")] = False,
) -> None:
    """Train a policy with RL on verifiable rewards (default: built-in model, arithmetic)."""
    try:
        cfg = load_config(config, overrides)
    except ConfigError as err:
        _fail(err)
    from cadence.recipes.train_rlvr import train as run_train

    try:
        run_train(cfg, resume=resume)
    except ConfigError as err:
        _fail(err)


@app.command()
def sft(overrides: Overrides = None, config: ConfigOpt = None) -> None:
    """Supervised warm-up on a task's synthetic examples (made the built-in model)."""
    from cadence.recipes.sft import load_sft_config
    from cadence.recipes.sft import sft as run_sft

    try:
        cfg = load_sft_config(config, overrides or [])
    except ConfigError as err:
        _fail(err)
    run_sft(cfg)


@app.command("eval")
def eval_(
    checkpoint: Annotated[str, typer.Argument(help="Checkpoint folder, or 'builtin'.")],
    overrides: Overrides = None,
    config: ConfigOpt = None,
) -> None:
    """Held-out accuracy (pass@1, pass@k with eval.samples=k) of a checkpoint."""
    try:
        cfg = load_config(config, [*(overrides or []), f"model.path={checkpoint}"])
    except ConfigError as err:
        _fail(err)
    from cadence.recipes.evaluate import run_eval

    result = run_eval(cfg)
    typer.echo(
        f"{checkpoint}: pass@1 {result.pass_at_1:.3f}  pass@{result.k} {result.pass_at_k:.3f}  "
        f"mean reward {result.mean_reward:.3f}  ({result.prompts} held-out prompts)"
    )


@app.command()
def algorithms() -> None:
    """List policy losses and advantage estimators, one line each."""
    from cadence.algo import advantages, losses

    typer.echo("policy losses (algorithm.loss=NAME):")
    for name, line in losses.describe().items():
        typer.echo(f"  {name:<16} {line}")
    typer.echo("advantage estimators (algorithm.advantage=NAME):")
    for name, line in advantages.describe().items():
        typer.echo(f"  {name:<16} {line}")


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
        typer.Option("--stop", help="Stop string ending the response (repeatable; \\n and \\t are understood)."),
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
            stop=[unescape(s) for s in stop or []],
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


def main() -> None:  # pragma: no cover - entry point for `python -m cadence`
    sys.exit(app())
