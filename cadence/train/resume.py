"""What `--resume` may change: the config a checkpoint was trained under, against the new one.

A resumed run silently trained under a different config is a different
experiment with the old one's name, so a changed field is refused unless the
user names it (`--allow-change trainer.steps,trainer.lr`; a section name such
as `logging` allows all of its fields). Allowed changes are appended to
`<run>/resume_changes.yaml`; the run's `config.yaml` keeps the config it
started with.

Fields that only change how a run is shown, never what it computes, may
change freely (`FREE`). So may a field the checkpoint's config does not have
at all, when it holds its schema default: cadence gained the field after the
checkpoint was saved, and a new field's default keeps the old behaviour. It is
still recorded with the other changes.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import yaml

from cadence.yaml_config import ConfigError

CONFIG_FILE = "run_config.yaml"  # inside each checkpoint: the config it was trained under
CHANGES_FILE = "resume_changes.yaml"
# Where the trainer computes changes no saved state (it is all on CPU): a GPU run may resume on CPU.
FREE = ("logging.progress", "trainer.device")
FIXED = ("runtime.rollout_workers",)  # the checkpoint holds one prompt cursor per worker


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Dotted field -> {"from": old value, "to": new value}, for fields that differ."""
    a, b = flatten(old), flatten(new)
    return {k: {"from": a.get(k), "to": b.get(k)} for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}


def _allowed(field: str, allow: list[str]) -> bool:
    return any(field == name or field.startswith(name + ".") for name in [*FREE, *allow])


def split_allow(values: list[str] | None) -> list[str]:
    """`--allow-change a.b,c --allow-change d` -> ["a.b", "c", "d"]."""
    return [part.strip() for v in values or [] for part in v.split(",") if part.strip()]


def check_resume_config(
    saved: dict[str, Any], current: dict[str, Any], allow: list[str], checkpoint: str,
    defaults: dict[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """The allowed changes; `ConfigError` (one line, naming the fields and the flag) otherwise.

    `defaults`: the schema's default config (nested, like `current`); a field missing from
    `saved` whose current value is its default is allowed.
    """
    changes = config_changes(saved, current)
    had, default = flatten(saved), flatten(defaults or {})
    added = {k for k, c in changes.items() if k not in had and k in default and default[k] == c["to"]}
    for field in FIXED:
        if field in changes:
            raise ConfigError(
                f"--resume: {field} cannot change on resume ({changes[field]['from']!r} -> "
                f"{changes[field]['to']!r}); set {field}={changes[field]['from']!r}"
            )
    refused = [k for k in changes if k not in added and not _allowed(k, allow)]
    if refused:
        shown = ", ".join(f"{k} ({changes[k]['from']!r} -> {changes[k]['to']!r})" for k in refused[:6])
        more = f" and {len(refused) - 6} more" if len(refused) > 6 else ""
        raise ConfigError(
            f"--resume: the config differs from the one {checkpoint} was trained under: {shown}{more}; "
            f"resume with the same config, or allow it with --allow-change {','.join(refused)}"
        )
    return {k: v for k, v in changes.items() if not any(k == f or k.startswith(f + ".") for f in FREE)}


def saved_config(checkpoint: Path, run_dir: Path) -> dict[str, Any] | None:
    """The config a checkpoint was trained under (older checkpoints: the run's config.yaml)."""
    for path in (checkpoint / CONFIG_FILE, run_dir / "config.yaml"):
        if path.is_file():
            return yaml.safe_load(path.read_text()) or {}
    return None


def record_changes(run_dir: Path, step: int, changes: dict[str, dict[str, Any]]) -> None:
    """Append one entry to `<run>/resume_changes.yaml`: when, from which step, what changed."""
    entry = {
        "resumed_at_step": step,
        "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "changes": changes,
    }
    with (run_dir / CHANGES_FILE).open("a") as f:
        f.write(yaml.safe_dump([entry], sort_keys=False))
