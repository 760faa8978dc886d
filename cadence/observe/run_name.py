"""Run names: a new folder per run unless `logging.name` is given, and `--resume` finds the latest.

Without `logging.name`, `cadence train` names the run by its start time
(`runs/2026-11-27_13-05-12`, as Hydra does), so one command after another never
collides with an earlier run's checkpoints. `cadence train --resume` without a name
continues the most recently started run under the same parent folder. A name given
explicitly keeps its old meaning: that folder, refused if it already holds
checkpoints and `--resume` is not given.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from cadence.observe.config import LoggingConfig
from cadence.yaml_config import ConfigError

CONFIG_FILE = "config.yaml"  # written when a run starts (train_rlvr.prepare_run_dir); marks a run folder


def named_explicitly(logging: LoggingConfig) -> bool:
    """Whether the config or an override set `logging.name` (not the start-time default)."""
    return "name" in logging.model_fields_set


def _run_pattern(logging: LoggingConfig) -> tuple[Path, str, str] | None:
    """Where this template's run folders live and the text around the name in theirs:
    `runs/{name}` -> (runs, "", ""), `runs/frozenlake-{name}` -> (runs, "frozenlake-", ""); None when
    `logging.run_dir` names one fixed folder."""
    path = Path(logging.run_dir)
    if path.name.count("{name}") != 1 or "{name}" in str(path.parent):
        return None
    prefix, suffix = path.name.split("{name}")
    return path.parent, prefix, suffix


def latest_run(root: Path, prefix: str = "", suffix: str = "") -> Path | None:
    """The most recently started run folder `root/<prefix>*<suffix>` (by its config.yaml's time), or None."""
    runs = [p.parent for p in root.glob(f"{prefix}*{suffix}/{CONFIG_FILE}")] if root.is_dir() else []
    return max(runs, key=lambda p: (p / CONFIG_FILE).stat().st_mtime, default=None)


def _keep_started_name(logging: LoggingConfig) -> None:
    saved = logging.resolved_run_dir() / CONFIG_FILE
    if saved.is_file():
        name = (yaml.safe_load(saved.read_text()) or {}).get("logging", {}).get("name")
        if isinstance(name, str):
            logging.name = name


def choose_run_name(logging: LoggingConfig, resume: bool) -> None:
    """Settle `logging.name` for `cadence train`, before anything loads: a fresh, unused
    start-time name for a new run; for `--resume`, the latest run's name."""
    pattern = _run_pattern(logging)
    if named_explicitly(logging):
        return
    if pattern is None:  # one fixed folder: a resumed run keeps the name it started with
        if resume:
            _keep_started_name(logging)
        return
    root, prefix, suffix = pattern
    if resume:
        found = latest_run(root, prefix, suffix)
        if found is None:
            raise ConfigError(f"--resume: no run to continue matching logging.run_dir={logging.run_dir}; "
                              "start one with `cadence train`, or name the run with logging.name=<name>")
        logging.name = found.name[len(prefix) : len(found.name) - len(suffix)]
        return
    base, n = logging.name, 1
    while logging.resolved_run_dir().exists():  # two runs started in the same second
        n += 1
        logging.name = f"{base}-{n}"
