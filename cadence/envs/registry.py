"""Environments by name: the built-ins, ``python:`` user classes, and `cadence envs`.

Built-in modules are imported only when named, so listing or validating a
config never pulls in gymnasium or an optional ecosystem package.
"""

from __future__ import annotations

import importlib
import inspect

from cadence.builtin_envs import BUILTIN_ENVS
from cadence.envs.contract import contract_problems
from cadence.envs.hubs import HUBS, hub_of, install_state, resolve_hub_env
from cadence.python_spec import PYTHON_PREFIX, load_python_object

WRAPPERS = {
    "latency": "env.latency.*: per-step delay ~ max(0, N(mean_s, std_s)), a fail_slow_share "
    "x fail_slow_factor slower, a fail_stop_share that never answers (any environment)",
}


def resolve_env_class(name: str) -> type:
    """The class an env name stands for; ValueError in one line when it is not usable."""
    if name in BUILTIN_ENVS:
        module, _, attr = BUILTIN_ENVS[name][0].partition(":")
        return getattr(importlib.import_module(module), attr)
    if hub_of(name) is not None:
        return resolve_hub_env(name)
    if not name.startswith(PYTHON_PREFIX):
        raise ValueError(f"env.name {name!r} is not a built-in, a hub name or a 'python:' spec")
    where = f"env.name {name!r}"
    cls = load_python_object(name, where, kind="class")
    problems = contract_problems(cls)
    if problems:
        raise ValueError(
            f"{where} is not an environment class: {'; '.join(problems)} "
            "(see 'The environment contract' in docs/agentic.md)"
        )
    return cls


def default_action_tag(cls: type) -> str | None:
    """The tag a class's actions come in when the config says 'auto'."""
    return getattr(cls, "action_tag", "answer")


def constructor_kwargs(cls: type) -> str:
    """Every keyword argument of `cls(...)` (env.kwargs.NAME) with its default: `size=4, rules=True`."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]  # past self
    return ", ".join(
        f"{p.name} (required)" if p.default is p.empty else f"{p.name}={p.default!r}"
        for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    )


def describe() -> dict[str, str]:
    """One line per built-in environment, for `cadence envs`: what it is, then every kwarg it takes
    (read from its constructor, so the list cannot fall behind the code)."""
    lines = {}
    for name, (_, line) in BUILTIN_ENVS.items():
        try:
            kwargs = constructor_kwargs(resolve_env_class(name))
        except ImportError as err:  # an optional ecosystem package that is not installed
            kwargs = f"listed once {err.name or 'its package'} is installed"
        lines[name] = f"{line} (kwargs: {kwargs})"
    return lines


def envs_command() -> None:
    """List the built-in environments, one line each."""
    import typer

    typer.echo("built-in environments (env.name=NAME; your own: env.name=python:module:Class):")
    for name, line in describe().items():
        typer.echo(f"  {name:<11} {line}")
    typer.echo("environment hubs (env.name=HUB:ID; verifiers: an agent):")
    for prefix, hub in HUBS.items():
        typer.echo(f"  {prefix:<11} {hub.what}; e.g. {hub.example} ({install_state(hub)})")
    typer.echo("wrappers:")
    for name, line in WRAPPERS.items():
        typer.echo(f"  {name:<11} {line}")
