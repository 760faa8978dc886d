"""JSON written by someone we do not trust (a model's tool call, an agent's request body), parsed
within bounds: a reply nested 100 000 deep made `json.loads` raise RecursionError, which nothing
expected (a 500, a lost run, a dashboard view that failed).

Every failure is a ValueError saying which bound or what is wrong, so a caller catches one class.
The text's size is bounded before parsing (`max_chars`; a request body by the endpoint's body
limit); the C parser is linear and stops at the interpreter's recursion limit (RecursionError,
caught here); what it returns is then walked, without recursion, and refused past `max_depth`.
(A bracket count before parsing would have to skip strings, and a regex that does so is
quadratic on a run of escaped quotes.)
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64  # a tool call's arguments or a tool's JSON schema are a few levels deep


def loads(text: str | bytes, max_depth: int = MAX_DEPTH, max_chars: int | None = None) -> Any:
    """`json.loads(text)`, or ValueError when it is not JSON (NaN and Infinity are not), is longer
    than `max_chars` or nests deeper than `max_depth`."""
    if isinstance(text, bytes):
        try:
            text = text.decode()
        except UnicodeDecodeError as e:
            raise ValueError(f"not UTF-8: {e}") from None
    if max_chars is not None and len(text) > max_chars:
        raise ValueError(f"{len(text)} characters of JSON, over the {max_chars} allowed")
    try:
        value = json.loads(text, parse_constant=_not_json)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {max_depth} levels") from None
    few_brackets = text.count("[") + text.count("{") <= max_depth  # cannot nest deeper: no walk
    if not few_brackets and nested_deeper(value, max_depth):
        raise ValueError(f"JSON nested deeper than {max_depth} levels")
    return value


def nested_deeper(value: Any, max_depth: int) -> bool:
    """Whether lists and dicts in `value` nest deeper than `max_depth` (`[]` is 1 deep). Level by
    level, so the per-item work is a type test and a C-level extend."""
    level, depth = [value], 0
    while level:
        containers = [item for item in level if type(item) is list or type(item) is dict]
        if not containers:
            return False
        depth += 1
        if depth > max_depth:
            return True
        level = []
        for container in containers:
            level.extend(container.values() if type(container) is dict else container)
    return False


def _not_json(name: str) -> None:
    raise ValueError(f"{name} is not JSON")  # Python's json reads NaN and Infinity; a number field must not
