"""`cadence simulate ...`: size a cluster before renting it.

Every subcommand takes `--preset` (a setup in cadence/simulate/presets),
an optional `--config` YAML file and `key.sub=value` overrides, e.g.
`cadence simulate compare --preset qwen3-8b-think cluster.gpus=64`.
"""

from __future__ import annotations

from typing import Annotated

import typer

from cadence.config import ConfigError
from cadence.simulate.config import SimConfig, load_sim_config, presets

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Simulate an RL run on a GPU cluster: sync vs async, scaling, split, alpha, tails, agentic episodes.")

Overrides = Annotated[list[str] | None, typer.Argument(help="Overrides like cluster.gpus=64.")]
Preset = Annotated[str, typer.Option("--preset", "-p", help="Starting setup (see `cadence simulate presets`).")]
ConfigOpt = Annotated[str | None, typer.Option("--config", "-c", help="YAML file over the preset.")]
DEFAULT_PRESET = "qwen3-8b-think"


@app.callback()
def _group() -> None:
    """Simulate an RL run on a GPU cluster: sync vs async, scaling, split, alpha, tails, agentic episodes."""


def _config(preset: str, config: str | None, overrides: list[str] | None) -> SimConfig:
    try:
        return load_sim_config(preset, config, overrides)
    except ConfigError as err:
        typer.secho(str(err), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None


def _numbers(text: str, kind: type, option: str) -> list:
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        typer.secho(f"{option}: expected comma-separated numbers, got {text!r}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None


def _progress(line: str) -> None:
    typer.secho(f"  {line}", err=True, dim=True)


def _show(rows: list[dict], columns: list[str]) -> None:
    from cadence.simulate.sweeps import format_table

    typer.echo(format_table(rows, columns))


@app.command("presets")
def presets_() -> None:
    """List the presets."""
    for name in presets():
        typer.echo(name)


@app.command()
def compare(overrides: Overrides = None, preset: Preset = DEFAULT_PRESET, config: ConfigOpt = None) -> None:
    """Synchronous (colocated) against asynchronous throughput on one budget."""
    from cadence.simulate import sweeps

    row = sweeps.compare(_config(preset, config, overrides), _progress)
    _show([row], ["gpus", "train_gpus", "sync_samples_per_s", "async_samples_per_s", "async_over_sync",
                  "sync_step_s", "async_step_s", "async_staleness"])


@app.command()
def scaling(
    overrides: Overrides = None, preset: Preset = DEFAULT_PRESET, config: ConfigOpt = None,
    gpus: Annotated[str, typer.Option(help="GPU counts; prompts per step grow with them.")] = "8,16,32,64,128",
) -> None:
    """Sync and async throughput as the cluster grows."""
    from cadence.simulate import sweeps

    rows = sweeps.scaling(_config(preset, config, overrides), _numbers(gpus, int, "--gpus"), _progress)
    _show(rows, ["gpus", "prompts_per_step", "train_gpus", "sync_samples_per_s", "async_samples_per_s",
                 "sync_scale", "async_scale", "async_over_sync"])


@app.command()
def split(
    overrides: Overrides = None, preset: Preset = DEFAULT_PRESET, config: ConfigOpt = None,
    train_gpus: Annotated[str, typer.Option(help="Training GPU counts to try.")] = "8,16,24,32",
) -> None:
    """Async throughput for each cut of the budget between generation and training."""
    from cadence.simulate import sweeps

    rows = sweeps.split(_config(preset, config, overrides), _numbers(train_gpus, int, "--train-gpus"), _progress)
    _show(rows, ["rollout_gpus", "train_gpus", "samples_per_s", "x_worst", "engine_busy", "beta_star_train_gpus"])


@app.command()
def alpha(
    overrides: Overrides = None, preset: Preset = DEFAULT_PRESET, config: ConfigOpt = None,
    alphas: Annotated[str, typer.Option(help="Asynchronous ratios to try.")] = "0,1,2,4,8",
) -> None:
    """Async throughput for each alpha on one split."""
    from cadence.simulate import sweeps

    rows = sweeps.alpha(_config(preset, config, overrides), _numbers(alphas, int, "--alphas"), _progress)
    _show(rows, ["alpha", "train_gpus", "samples_per_s", "of_best", "x_sync", "staleness"])


@app.command()
def tail(
    overrides: Overrides = None, preset: Preset = DEFAULT_PRESET, config: ConfigOpt = None,
    sigmas: Annotated[str, typer.Option(help="Lognormal sigmas of the response lengths.")] = "0,0.5,1.0",
) -> None:
    """Sync against async as responses grow more long-tailed."""
    from cadence.simulate import sweeps

    rows = sweeps.tail(_config(preset, config, overrides), _numbers(sigmas, float, "--sigmas"), _progress)
    _show(rows, ["sigma", "train_gpus", "sync_samples_per_s", "async_samples_per_s", "async_over_sync"])


@app.command()
def agentic(
    overrides: Overrides = None, preset: Annotated[str, typer.Option("--preset", "-p")] = "alfworld",
    config: ConfigOpt = None,
    redundancy: Annotated[int, typer.Option(help="Extra episodes per group in the redundancy step.")] = 2,
    extra_groups: Annotated[int, typer.Option(help="Extra groups per worker in the redundancy step.")] = 1,
    alpha_: Annotated[int, typer.Option("--alpha", help="Asynchronous ratio of the last step.")] = 2,
    train_gpus: Annotated[str, typer.Option(help="Training GPU counts to try in the last step (best kept); "
                                            "empty: beta*'s.")] = "",
) -> None:
    """Agentic episodes: lock-step sync, then env-level async, redundancy and alpha on top."""
    from cadence.simulate import sweeps

    splits = _numbers(train_gpus, int, "--train-gpus") or None
    rows = sweeps.agentic(_config(preset, config, overrides), redundancy, extra_groups, alpha_, splits, _progress)
    _show(rows, ["setting", "train_gpus", "step_s", "samples_per_s", "x_lockstep", "x_previous", "engine_busy",
                 "staleness"])


@app.command("env-latency")
def env_latency(
    overrides: Overrides = None, preset: Annotated[str, typer.Option("--preset", "-p")] = "alfworld",
    config: ConfigOpt = None,
    means: Annotated[str, typer.Option(help="Mean (= std) seconds of an environment step.")] = "0,1,5,10",
) -> None:
    """Lock-step against env-level async as environment steps get slower."""
    from cadence.simulate import sweeps

    rows = sweeps.env_latency(_config(preset, config, overrides), _numbers(means, float, "--means"), _progress)
    _show(rows, ["latency_s", "lockstep_step_s", "async_step_s", "async_over_lockstep"])
