"""`cadence envs` lists every keyword argument of every built-in environment, with its default."""

from __future__ import annotations

import inspect

from typer.testing import CliRunner

from cadence.cli import app
from cadence.envs.registry import BUILTIN_ENVS, resolve_env_class


def test_every_constructor_argument_is_listed():
    output = CliRunner().invoke(app, ["envs"]).output
    lines = {line.split()[0]: line for line in output.splitlines() if line.startswith("  ")}
    assert "rules=True" in lines["frozenlake"] and "neighbours=False" in lines["frozenlake"]  # examples/frozenlake.yaml's
    for name in BUILTIN_ENVS:
        params = list(inspect.signature(resolve_env_class(name).__init__).parameters)[1:]
        assert params and all(f" {p}=" in lines[name] or f" {p} (required)" in lines[name] for p in params), name
