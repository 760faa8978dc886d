"""The Anthropic Messages API (`POST /v1/messages`) on the endpoint's chat path.

A request is translated to chat messages and sampled like a chat completion
(same template, same trajectory, same limits); the reply goes back as content
blocks:

    system (string | text blocks)  -> a system message first
    messages [{"role", "content"}] -> chat messages; content a string or blocks:
      text                           -> the message's text
      tool_use {id, name, input}     -> a tool call of that assistant message
      tool_result {tool_use_id, content} -> a "tool" message (before the user's text)
    tools [{"name", "description", "input_schema"}] -> chat tools
    tool_choice {"type": auto | any | tool | none}; "none" returns text
    max_tokens (required), temperature [0, 1], top_p, stop_sequences, stream

    reply -> content [{"type": "text"}, {"type": "tool_use", "id", "name", "input"}...],
             stop_reason end_turn | tool_use | max_tokens | stop_sequence

Errors are Anthropic's shape ({"type": "error", "error": {"type", "message"}}),
which the `anthropic` client raises as its own `BadRequestError` and so on. The
run is named by the URL (`/runs/<run>`, the client's base_url without `/v1`)
or by the key, sent as `x-api-key` or `Authorization: Bearer`.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse, Response

from cadence.agents import protocol, untrusted_json, wire
from cadence.inference.types import GenResult

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 503: "overloaded_error"}


def error_body(error: wire.BadRequest) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(error.status, "api_error"),
                                       "message": f"{error.param}: {error}"}}


def parse(body: dict, limits: wire.RequestLimits) -> wire.Request:
    if body.get("max_tokens") is None:
        raise wire.BadRequest("max_tokens", "max_tokens is required")
    stops = body.get("stop_sequences") or []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise wire.BadRequest("stop_sequences", "stop_sequences must be a list of non-empty strings")
    fields = {k: body.get(k) for k in ("max_tokens", "temperature", "top_p", "stream")}
    request = wire._common({**fields, "stop": stops}, limits, "max_tokens")
    if request.params.temperature > 1:
        raise wire.BadRequest("temperature", f"temperature must be in [0, 1], got {request.params.temperature!r}")
    system = body.get("system")
    request.messages = ([{"role": "system", "content": _text(system, "system")}] if system else []) + _messages(
        body.get("messages"))
    request.tools = protocol.chat_tools(body.get("tools"), "input_schema", (None, "custom"), "send {name, "
                                        "description, input_schema}; server tools (bash, web search) are not served")
    choice = body.get("tool_choice") or {"type": "auto"}
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise wire.BadRequest("tool_choice", 'tool_choice must be {"type": "auto" | "any" | "tool" | "none"}')
    request.tool_choice = "none" if choice["type"] == "none" else "auto"  # nothing forces a call (docs/agents.md)
    return request


def _messages(messages: Any) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise wire.BadRequest("messages", "messages must be a non-empty list of {role, content} objects")
    out: list[dict] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise wire.BadRequest(where, f"{where} must have role user or assistant")
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise wire.BadRequest(where, f"{where}.content must be a string or a list of blocks")
        text, calls = "", []
        for j, block in enumerate(blocks):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text" and isinstance(block.get("text"), str):
                text += block["text"]
            elif kind == "tool_use" and message["role"] == "assistant":
                calls.append({"id": _field(block, "id", str, f"{where}.content[{j}]"), "type": "function",
                              "function": {"name": _field(block, "name", str, f"{where}.content[{j}]"),
                                           "arguments": json.dumps(block.get("input", {}))}})
            elif kind == "tool_result" and message["role"] == "user":
                out.append({"role": "tool", "content": _text(block.get("content", ""), f"{where}.content[{j}]"),
                            "tool_call_id": _field(block, "tool_use_id", str, f"{where}.content[{j}]")})
            else:
                raise wire.BadRequest(f"{where}.content[{j}]", f"{where}.content[{j}] must be a text block, a "
                                      "tool_use block (assistant) or a tool_result block (user); images, documents "
                                      "and thinking blocks are not supported")
        if calls:
            out.append({"role": "assistant", "content": text or None, "tool_calls": calls})
        elif text or not any(b.get("type") == "tool_result" for b in blocks):
            out.append({"role": message["role"], "content": text})
    return out


def _text(content: Any, where: str) -> str:
    """A string, or the text of text blocks joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text"
                                         and isinstance(b.get("text"), str) for b in content):
        return "".join(b["text"] for b in content)
    raise wire.BadRequest(where, f"{where} must be a string or a list of text blocks")


def _field(block: dict, name: str, kind: type, where: str) -> Any:
    if not isinstance(block.get(name), kind):
        raise wire.BadRequest(f"{where}.{name}", f"{where}.{name} must be a {kind.__name__}")
    return block[name]


# -- the reply ---------------------------------------------------------------
def answer(request: wire.Request, model: str, prompt_ids: list[int], result: GenResult,
           reply: tuple[str | None, list[dict]], sampled: str) -> Response:
    """`sampled`: the whole decoded reply, which holds the stop sequence `result.text` was cut at."""
    content, calls = reply
    blocks: list[dict] = [{"type": "text", "text": content}] if content or not calls else []
    blocks += [{"type": "tool_use", "id": c["id"].replace("call_", "toolu_", 1), "name": c["function"]["name"],
                "input": untrusted_json.loads(c["function"]["arguments"])} for c in calls]
    stop = next((s for s in request.params.stop if s in sampled), None) if result.finish_reason == "stop" else None
    if calls:
        stop_reason = "tool_use"
    elif result.finish_reason == "length":
        stop_reason = "max_tokens"
    else:
        stop_reason = "stop_sequence" if stop else "end_turn"
    message = {"id": wire.new_id("msg"), "type": "message", "role": "assistant", "model": model,
               "content": blocks, "stop_reason": stop_reason, "stop_sequence": stop,
               "usage": {"input_tokens": len(prompt_ids), "output_tokens": len(result.token_ids)}}
    return protocol.event_stream(stream_events(message)) if request.stream else JSONResponse(message)


def stream_events(message: dict) -> list[tuple[str, dict]]:
    """A finished message as the Messages stream: message_start, per block its start, one delta
    and stop, then message_delta (stop reason, output tokens) and message_stop."""
    events = [("message_start", {"type": "message_start", "message": {
        **message, "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {**message["usage"], "output_tokens": 0}}})]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            start, delta = {**block, "text": ""}, {"type": "text_delta", "text": block["text"]}
        else:
            start, delta = {**block, "input": {}}, {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events += [("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}),
                   ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}),
                   ("content_block_stop", {"type": "content_block_stop", "index": index})]
    events += [("message_delta", {"type": "message_delta", "delta": {"stop_reason": message["stop_reason"],
                                                                     "stop_sequence": message["stop_sequence"]},
                                  "usage": {"output_tokens": message["usage"]["output_tokens"]}}),
               ("message_stop", {"type": "message_stop"})]
    return events
