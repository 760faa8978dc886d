"""A run folder's small files, read so that a bad one cannot break the page.

Run folders are written by cadence, but also copied half-way, edited by hand,
or made by other tools: any file may be missing, not JSON/YAML, or hold values
of the wrong type. Each reader here returns what it could read and, for a file
it could not, one line naming the file and what is wrong; the dashboard shows
that line as the run's error and goes on with the other runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from cadence.observe.run_status import STATUS_FILE, read_status
from cadence.train.resume import CHANGES_FILE

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
UNREADABLE = "unreadable"  # the state of a run whose status.json cannot be read


def read_json(path: Path) -> Any:
    """The file's JSON value, or None (missing, not JSON, not UTF-8)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def dig(tree: Any, *keys: str) -> Any:
    """tree[k1][k2]...; None where a level is missing or not a mapping."""
    for key in keys:
        if not isinstance(tree, dict):
            return None
        tree = tree.get(key)
    return tree


def run_status(run_dir: Path) -> dict[str, Any]:
    """`read_status`, or a status in state `unreadable` whose error says what is wrong with the file.
    `state` is always a string, `error` and `traceback` strings or None."""
    path = run_dir / STATUS_FILE
    if path.exists() and not isinstance(read_json(path), dict):
        return {"state": UNREADABLE, "error": f"{STATUS_FILE}: not a JSON object (fix or delete it)"}
    try:
        status = read_status(run_dir)
    except Exception as err:  # a field of the wrong type, e.g. a heartbeat that is not a number
        return {"state": UNREADABLE, "error": f"{STATUS_FILE}: {type(err).__name__}: {err}"}
    status["state"] = str(status.get("state") or "unknown")
    for key in ("error", "traceback"):
        if status.get(key) is not None:
            status[key] = str(status[key])
    return status


def _yaml(path: Path) -> tuple[Any, str | None]:
    """(the file's YAML value or None, the problem or None)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as err:
        return None, f"{path.name}: unreadable ({type(err).__name__}: {err})"
    try:
        return yaml.load(text, Loader=_Loader), None
    except yaml.YAMLError as err:
        return None, f"{path.name}: not valid YAML ({' '.join(str(err).split())})"


def read_config(run_dir: Path) -> tuple[dict[str, Any], str | None]:
    """config.yaml as a mapping ({} when missing or unreadable), and the problem if any."""
    cfg, problem = _yaml(run_dir / "config.yaml")
    if cfg is not None and not isinstance(cfg, dict):
        return {}, "config.yaml: not a mapping of sections (trainer:, task:, ...)"
    return cfg or {}, problem


def target_steps(cfg: dict[str, Any], run_dir: Path) -> Any:
    """trainer.steps as the run trains now: config.yaml keeps the config a run started with, and
    each `--resume --allow-change trainer.steps` appends the new value to resume_changes.yaml."""
    steps = dig(cfg, "trainer", "steps")
    entries, _ = _yaml(run_dir / CHANGES_FILE)
    for entry in entries if isinstance(entries, list) else []:
        changed = dig(entry, "changes", "trainer.steps", "to")
        if type(changed) is int:
            steps = changed
    return steps if type(steps) is int else None


def trains_on(cfg: dict[str, Any]) -> str | None:
    """What the run trains on: its environment's name for agentic runs, its agent's for agent
    runs (config.yaml still holds the default task section in both), else the task's name."""
    name = dig(cfg, "env", "name") or dig(cfg, "agent", "name") or dig(cfg, "task", "name")
    return None if name is None else str(name)
