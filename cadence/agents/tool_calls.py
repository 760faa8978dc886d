"""Tool calls between the OpenAI wire format and a chat template's markup.

Two directions:

- In: the messages an agent sends carry earlier tool calls the OpenAI way
  (`function.arguments` is a JSON *string*); chat templates (HF convention)
  expect `arguments` as a mapping and render it with `tojson`. `template_messages`
  converts, so the template writes the call exactly as the model wrote it.
- Out: the text a model sampled holds its tool calls in its family's markup;
  `parse_tool_calls` turns it into OpenAI `tool_calls`. Two formats:
    "hermes"      Hermes / Qwen 2.5+: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
                  one block per call, content before the first block.
    "llama3_json" Llama 3.1+: the whole reply is `{"name": ..., "parameters": {...}}`
                  (optionally after `<|python_tag|>`, several joined by `;`).
  `detect_tool_format` picks one from the tokenizer's chat template.

The text is the model's: a call that does not parse (not JSON, nested past
`untrusted_json.MAX_DEPTH`, no name) leaves the whole reply as plain text, and
blocks are found with `str.find`, linear in the text (a regex with
whitespace runs around a lazy `.*?` scanned a long reply quadratically).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from cadence.agents import untrusted_json

TOOL_FORMATS = ("hermes", "llama3_json")
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"


def detect_tool_format(chat_template: str | None) -> str | None:
    """The tool-call format a chat template writes, or None when it has no tool markup."""
    if not chat_template:
        return None
    if "<tool_call>" in chat_template:
        return "hermes"
    if "ipython" in chat_template or '"parameters"' in chat_template:
        return "llama3_json"
    return None


def template_messages(messages: list[dict]) -> list[dict]:
    """OpenAI messages as chat templates expect them: text content as one string (never None),
    tool-call arguments as mappings."""
    out = []
    for message in messages:
        message = dict(message)
        message["content"] = _text(message.get("content"))
        if message.get("tool_calls"):
            message["tool_calls"] = [_call_for_template(c) for c in message["tool_calls"]]
        out.append(message)
    return out


def parse_tool_calls(text: str, tool_format: str) -> tuple[str | None, list[dict]]:
    """(content, OpenAI tool_calls) from a sampled reply; ([text], []) when it holds no call."""
    if tool_format == "hermes":
        spans = hermes_blocks(text)
        calls = [_openai_call(text[start + len(HERMES_OPEN):end - len(HERMES_CLOSE)]) for start, end in spans]
        if not calls or None in calls:
            return text, []
        content = text[: spans[0][0]].strip()
        return content or None, calls
    if tool_format == "llama3_json":
        body = text.strip().removeprefix("<|python_tag|>").strip()
        if not body.startswith("{"):
            return text, []
        calls = [_openai_call(part) for part in body.split(";")]
        if None in calls:
            return text, []
        return None, calls
    raise ValueError(f"tool format {tool_format!r} is not one of {TOOL_FORMATS}")


def hermes_blocks(text: str) -> list[tuple[int, int]]:
    """(start, end) of each `<tool_call>...</tool_call>` block in `text`, markup included."""
    spans, at = [], 0
    while (start := text.find(HERMES_OPEN, at)) >= 0:
        end = text.find(HERMES_CLOSE, start + len(HERMES_OPEN))
        if end < 0:
            break
        at = end + len(HERMES_CLOSE)
        spans.append((start, at))
    return spans


def _openai_call(blob: str) -> dict | None:
    """One OpenAI tool call from a JSON object with a name and arguments (or parameters)."""
    try:
        obj = untrusted_json.loads(blob.strip())
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": obj["name"], "arguments": json.dumps(arguments)},
    }


def _call_for_template(call: dict) -> dict:
    function = dict(call.get("function", call))
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            function["arguments"] = untrusted_json.loads(arguments)
        except ValueError:
            pass  # the template gets the string as the agent sent it
    return {**call, "function": function}


def _text(content: Any) -> str:
    """Message content as one string: OpenAI allows a list of parts; text parts are joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise ValueError(f"message content must be a string or a list of parts, got {type(content).__name__}")
