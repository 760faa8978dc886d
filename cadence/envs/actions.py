"""Taking the action out of a policy response: ``... <answer>Left</answer>`` -> ``Left``."""

from __future__ import annotations

import re
from functools import lru_cache


@lru_cache(maxsize=32)
def _tag_pattern(tag: str) -> re.Pattern[str]:
    return re.compile(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", re.DOTALL | re.IGNORECASE)


def extract_action(response: str, tag: str | None) -> str | None:
    """The text inside the *last* ``<tag>...</tag>`` (stripped), or None when there is none.

    The last one, so a response that thinks aloud about several moves is held to
    its final choice. With ``tag=None`` the whole response is the action.
    """
    if tag is None:
        return response
    found = _tag_pattern(tag).findall(response)
    return found[-1].strip() if found else None


def format_hint(tag: str) -> str:
    """What the policy is told after a response without an action tag."""
    return f"Invalid format: no <{tag}>...</{tag}> found. Reply with your action in <{tag}>...</{tag}>."
