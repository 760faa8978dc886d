"""Model-derived text cut to size before it is logged.

A failure's message and traceback can hold the model's text (an exception naming the response or
the action): what goes to the logs is cut to these limits, so a crafted response can neither fill
them nor hold up whatever reads them back (the dashboard). Rewards and environments both log
failures, so the limits live below both.
"""

from __future__ import annotations

MAX_MESSAGE_CHARS = 1000
MAX_TRACEBACK_CHARS = 20000


def clip(text: str, limit: int) -> str:
    """`text`, or its start and end around a note of how much was cut when it is longer than `limit`."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]} ... [{len(text) - 2 * half} characters cut] ... {text[-half:]}"
