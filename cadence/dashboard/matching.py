"""`?match=REGEX` over a run's metric keys, bounded in size and time.

Metric keys come from run files and the pattern from the request, so either
can make a backtracking search run for minutes (`(a|a)+$` against a long key).
Python's `re` cannot be stopped and holds the GIL while it searches, so a single
request would freeze the server; the `regex` module takes a timeout and, with
`concurrent=True`, releases the GIL, so the search runs in a worker thread
while the event loop serves everyone else.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import regex

MAX_PATTERN = 2000  # characters; the page's own pattern is about 400
MATCH_TIMEOUT_S = 1.0  # all keys together


class MatchError(ValueError):
    """A pattern that is not a regular expression, too long, or too slow (one line, for a 400)."""


def compile_match(pattern: str) -> regex.Pattern:
    if len(pattern) > MAX_PATTERN:
        raise MatchError(f"match: the pattern has {len(pattern)} characters, more than {MAX_PATTERN}; "
                         "use a shorter one, or name the keys with ?keys=a,b")
    try:
        return regex.compile(pattern)
    except (regex.error, OverflowError, RecursionError) as err:
        raise MatchError(f"match: not a regular expression ({err})") from None


def matching(pattern: str, keys: Iterable[str], timeout_s: float = MATCH_TIMEOUT_S) -> list[str]:
    """The keys `pattern` finds (re.search semantics), sorted; MatchError past `timeout_s` in all."""
    compiled = compile_match(pattern)
    deadline = time.monotonic() + timeout_s
    found = []
    for key in sorted(keys):
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            if compiled.search(key, timeout=left, concurrent=True):
                found.append(key)
        except TimeoutError:
            raise MatchError(f"match: the pattern took more than {timeout_s:g} s over this run's keys "
                             "(nested repetition such as (a|a)+ backtracks); simplify it") from None
    return found
