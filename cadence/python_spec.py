"""Load what a ``python:<module or file.py>:<name>`` spec names (user rewards, user environments).

One loader for every plug-in point, so a reward function and an environment
class are found, and fail to be found, the same way: the error is one line
saying which setting, what went wrong and, for a misspelt name, what is there.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from cadence.data.tasks import stable_hash

PYTHON_PREFIX = "python:"


def _load_file_module(path: Path) -> ModuleType:
    # A stable name per file: loading the same file twice (config check, then build) reuses it.
    name = f"cadence_user_{stable_hash(path.resolve()):x}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_python_object(spec: str, where: str, kind: str = "function") -> object:
    """The object ``python:target:name`` names; ValueError (prefixed with `where`) says why not.

    `target` is a module path (``pkg.rewards``) or a file (``/abs/rewards.py``,
    ``./rewards.py``); `kind` ("function", "class") only words the messages.
    """
    body = spec[len(PYTHON_PREFIX) :] if spec.startswith(PYTHON_PREFIX) else spec
    target, _, attr = body.rpartition(":")
    if not target or not attr:
        raise ValueError(
            f"{where}: expected 'python:module.path:{kind}' or 'python:/path/file.py:{kind}'"
        )
    is_file = target.endswith(".py") or "/" in target
    path = Path(target).expanduser()
    if is_file and not path.is_file():
        raise ValueError(f"{where}: file not found: {path}")
    try:
        module = _load_file_module(path) if is_file else importlib.import_module(target)
    except (Exception, SystemExit) as exc:  # any error while importing user code
        raise ValueError(
            f"{where}: importing {target!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    obj = getattr(module, attr, None)
    if obj is None:
        names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        close = difflib.get_close_matches(attr, names, n=3)
        hint = (
            f" Did you mean: {', '.join(close)}?"
            if close
            else f" Callables there: {sorted(names)[:20]}"
        )
        raise ValueError(f"{where}: {target!r} has no {kind} {attr!r}.{hint}")
    return obj


def check_known_kwargs(kwargs: dict, accepted: list[str], field: str, owner: str) -> None:
    """A kwarg the callable does not take is a one-line error naming `field.key` and the fix."""
    for key in kwargs:
        if key not in accepted:
            close = difflib.get_close_matches(key, accepted, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"{owner} takes {accepted or 'none'}"
            raise ValueError(f"{field}.{key}: unknown argument; {hint}")
