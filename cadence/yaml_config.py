"""Reading any of cadence's YAML configs: a file, `a.b=value` overrides, and errors a person can act on.

Schema-agnostic: `cadence.config` (train runs), `cadence sft` and `cadence simulate`
each validate their own pydantic schema with these pieces.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError


class ConfigError(ValueError):
    """A config problem, phrased for the person who wrote the config."""


def parse_override(text: str) -> tuple[list[str], Any]:
    """`trainer.lr=3e-4` -> (["trainer", "lr"], 0.0003); values are parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.sub=value")
    key, raw = text.split("=", 1)
    if not key.strip():
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        raise ConfigError(f"override {text!r}: the value is not valid YAML; quote it") from None
    return key.strip().split("."), value


def apply_override(tree: dict, path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {'.'.join(path)}: {part} is not a section")
        node = child
    node[path[-1]] = value


def _explain(err: ValidationError, schema: type[BaseModel]) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "config"
        if e["type"] == "extra_forbidden":
            lines.append(f"  {where}: unknown key{_suggest(e['loc'], schema)}")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"  {where}: {msg} (got {e.get('input')!r})")
    return "invalid config:\n" + "\n".join(lines)


def _suggest(loc: tuple, schema: type[BaseModel]) -> str:
    """Name the closest valid key, walking the schema along `loc`."""
    model: Any = schema
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return ""
        model = _section(field.annotation)
    names = list(getattr(model, "model_fields", {}))
    close = difflib.get_close_matches(str(loc[-1]), names, n=1)
    return f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(names)}"


def _section(annotation: Any) -> Any:
    """The schema inside an optional section (`EnvConfig | None`), else `annotation` itself."""
    for arg in get_args(annotation):
        if hasattr(arg, "model_fields"):
            return arg
    return annotation


def read_yaml(path: str | os.PathLike) -> dict:
    """A config file's top-level mapping, or a one-line `ConfigError` saying what is wrong."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {p} does not exist")
    if p.is_dir():
        raise ConfigError(f"config file {p} is a folder; --config takes a YAML file")
    try:
        tree = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError:
        raise ConfigError(f"config file {p} is not a text (UTF-8) file") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(p)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"config file {where}: invalid YAML ({problem})") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"config file {p} must hold a mapping at the top level (key: value lines)")
    return tree
