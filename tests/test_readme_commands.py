"""The README's commands, in order: each one parses (config validated, subcommand known) without
running. `python scripts/check_readme.py` runs them all on a fresh clone in a fresh venv (tens of
minutes: a venv, an install, the runs; too long for the test suite, which CI runs on every stop)."""

from __future__ import annotations

import importlib.util
import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cadence.cli import app
from cadence.config import load_config

ROOT = Path(__file__).parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("check_readme", ROOT / "scripts" / "check_readme.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_readme"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


check_readme = _script()
README = (ROOT / "README.md").read_text()
STEPS = check_readme.plan(check_readme.readme_commands(README))
CADENCE = [s for s in STEPS if s.kind in ("cadence", "server")]


def test_the_commands_come_out_in_the_readmes_order():
    commands = [s.command for s in STEPS]
    assert commands.index("pip install -e .") < commands.index("cadence train")  # install first
    trains = [c for c in commands if c.startswith("cadence train")]
    assert trains[0] == "cadence train" and "--resume" in trains[1]  # the quick start, then its resume
    assert all(s.kind == "tests" for s in STEPS if "pytest" in s.command)
    # Every shortened or checked command is still in the README: the tables cannot go stale.
    checked = [check_readme.SHORTENED, check_readme.FAST, check_readme.EXPECT, check_readme.SERVERS]
    assert set().union(*checked) <= set(commands)


def _train_arguments(args: list[str]) -> tuple[str | None, list[str]]:
    """--config and the overrides of a `cadence train` line (flags left out)."""
    config, overrides, rest = None, [], iter(args)
    for arg in rest:
        if arg in ("--config", "-c"):
            config = next(rest)
        elif arg == "--allow-change":
            next(rest)
        elif not arg.startswith("--"):
            overrides.append(arg)
    return config, overrides


@pytest.mark.parametrize("step", CADENCE, ids=[s.command for s in CADENCE])
def test_every_cadence_command_parses(step, monkeypatch):
    monkeypatch.chdir(ROOT)  # the README's paths are relative to the checkout
    args = shlex.split(step.run)
    assert args[0] == "cadence"
    if args[1] == "train":  # its whole config, validated as `cadence train` would before loading anything
        config, overrides = _train_arguments(args[2:])
        load_config(config, overrides)
    elif args[1] == "eval":
        load_config(None, [*args[3:], f"model.path={args[2]}"])
    command = args[1:3] if args[1] in ("sandbox", "simulate") else args[1:2]
    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
