"""What the Responses and Messages APIs share on top of the chat path: tools and named events."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

from cadence.agents import wire


def chat_tools(tools: Any, schema: str, kinds: tuple[str | None, ...], advice: str) -> list[dict] | None:
    """Tools written {"type", "name", "description", <schema>} as chat tools; a 400 naming the first
    whose type is not one of `kinds` or that has no name."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise wire.BadRequest("tools", f"tools must be a list: {advice}")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") not in kinds or not isinstance(tool.get("name"), str):
            raise wire.BadRequest(f"tools[{i}]", f"tools[{i}] is not served: {advice}")
        function = {"name": tool["name"], "description": tool.get("description"),
                    "parameters": tool.get(schema) or {"type": "object"}}  # the order chat tools are written in
        out.append({"type": "function", "function": {k: v for k, v in function.items() if v is not None}})
    return out or None


def event_stream(events: list[tuple[str, dict]]) -> Response:
    """One finished reply as server-sent events with names (`event: ...`). The hub hands back whole
    results, so every event is known before the first is sent, and they go as one body."""
    body = "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events)
    return Response(body, media_type="text/event-stream")
