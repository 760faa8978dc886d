"""JSON written by someone we do not trust (a model's tool call, an agent's request body), parsed
within bounds: a reply nested 100 000 deep made `json.loads` raise RecursionError, which nothing
expected (a 500, a lost run, a dashboard view that failed).

Every failure is a ValueError saying which bound or what is wrong, so a caller catches one class.
The nesting is measured before parsing, on the brackets outside strings, in passes that each drop
the innermost `[]`/`{}` pairs (one regex scan each: C speed, one pass per level up to
`max_depth`).
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 64  # a tool call's arguments or a tool's JSON schema are a few levels deep
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)  # one alternative per character: linear
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_INNERMOST = re.compile(r"\[\]|\{\}")  # one scan: a pair it uncovers waits for the next pass


def nesting_over(text: str, max_depth: int) -> bool:
    """Whether `text`'s brackets (outside strings) nest deeper than `max_depth`."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    for _ in range(max_depth):
        if not brackets:
            return False
        inner = _INNERMOST.sub("", brackets)
        if len(inner) == len(brackets):
            return False  # unbalanced, so not JSON: json.loads says where (its RecursionError is caught)
        brackets = inner
    return bool(brackets)


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
    if nesting_over(text, max_depth):
        raise ValueError(f"JSON nested deeper than {max_depth} levels")
    try:
        return json.loads(text, parse_constant=_not_json)
    except RecursionError:  # brackets that do not balance, nested deep before the error shows
        raise ValueError(f"JSON nested deeper than {max_depth} levels") from None


def _not_json(name: str) -> None:
    raise ValueError(f"{name} is not JSON")  # Python's json reads NaN and Infinity; a number field must not
