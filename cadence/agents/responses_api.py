"""The OpenAI Responses API (`POST /v1/responses`) on the endpoint's chat path.

A request is translated to chat messages and sampled like a chat completion
(same template, same trajectory, same limits); the reply goes back as output
items:

    input (string | items)         -> messages
      {"role", "content"}            -> that message ("developer" is "system";
                                        input_text / output_text parts joined)
      {"type": "function_call"}      -> a tool call of the assistant message before it
      {"type": "function_call_output"} -> a "tool" message (call_id -> tool_call_id)
    instructions                   -> a system message first
    tools [{"type": "function", "name", "parameters"}] -> chat tools
    max_output_tokens, temperature, top_p, tool_choice, stream

    reply -> output [{"type": "message", content [output_text]}, {"type": "function_call"}...]

State stays with the client: `previous_response_id` and `conversation` are refused
(400 naming them), since training needs each request's whole history to render
the prompt the engine sees; nothing is stored (`store` is ignored). One reply per
request: the Responses API has no `n`.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.responses import JSONResponse, Response

from cadence.agents import protocol, wire
from cadence.inference.types import GenResult

STATEFUL = ("previous_response_id", "conversation")
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def parse(body: dict, limits: wire.RequestLimits) -> wire.Request:
    for name in STATEFUL:
        if body.get(name) is not None:
            raise wire.BadRequest(name, f"{name} is not supported: the endpoint stores no responses; send the "
                                  "whole conversation in `input` (the previous output items, then the new ones)")
    fields = {k: body.get(k) for k in ("max_output_tokens", "temperature", "top_p", "stream")}
    request = wire._common(fields, limits, "max_output_tokens")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise wire.BadRequest("instructions", "instructions must be a string")
    request.messages = ([{"role": "system", "content": instructions}] if instructions else []) + _messages(
        body.get("input"))
    request.tools = protocol.chat_tools(body.get("tools"), "parameters", ("function",), 'send {"type": "function", '
                                        '"name", "parameters"}; built-in tools (web search, files) are not served')
    request.tool_choice = body.get("tool_choice") or "auto"
    return request


def _messages(items: Any) -> list[dict]:
    """Chat messages from `input`: a string, or a list of message and function-call items."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise wire.BadRequest("input", "input must be a string or a non-empty list of items")
    messages: list[dict] = []
    for i, item in enumerate(items):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message" and ROLES.get(item.get("role")):
            messages.append({"role": ROLES[item["role"]], "content": _text(item.get("content"), f"input[{i}]")})
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", i), "type": "function",
                    "function": {"name": _string(item, "name", i), "arguments": _string(item, "arguments", i)}}
            if not messages or messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": None})
            messages[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", i),
                             "content": _text(item.get("output"), f"input[{i}].output")})
        else:
            raise wire.BadRequest(f"input[{i}]", "an input item must be a message (role user, assistant, system "
                                  "or developer), a function_call or a function_call_output")
    return messages


def _text(content: Any, where: str) -> str:
    """A string, or the text of input_text / output_text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") in ("input_text", "output_text")
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise wire.BadRequest(where, f"{where} content must be a string or a list of input_text parts "
                          "(images and files are not supported)")


def _string(item: dict, name: str, i: int) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise wire.BadRequest(f"input[{i}].{name}", f"input[{i}].{name} must be a string")
    return value


# -- the reply ---------------------------------------------------------------
def answer(request: wire.Request, model: str, prompt_ids: list[int], result: GenResult,
           reply: tuple[str | None, list[dict]]) -> Response:
    content, calls = reply
    output = []
    if content or not calls:
        output.append({"type": "message", "id": wire.new_id("msg"), "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "text": content or "", "annotations": [],
                                    "logprobs": []}]})
    output += [{"type": "function_call", "id": wire.new_id("fc"), "call_id": c["id"], "status": "completed",
                "name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in calls]
    cut = result.finish_reason == "length" and not calls
    tokens = wire.usage(prompt_ids, [result])
    response = {
        "id": wire.new_id("resp"), "object": "response", "created_at": int(time.time()), "model": model,
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "error": None,
        "instructions": None, "output": output, "parallel_tool_calls": True,
        "temperature": request.params.temperature, "top_p": request.params.top_p,
        "max_output_tokens": request.params.max_new_tokens, "tool_choice": request.tool_choice,
        "tools": [{"type": "function", **t["function"]} for t in request.tools or []], "metadata": {},
        "usage": {"input_tokens": tokens["prompt_tokens"], "output_tokens": tokens["completion_tokens"],
                  "total_tokens": tokens["total_tokens"], "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
    }
    return protocol.event_stream(stream_events(response)) if request.stream else JSONResponse(response)


def stream_events(response: dict) -> list[tuple[str, dict]]:
    """A finished response as the Responses stream: created, then per output item its added,
    delta and done events, then completed (or incomplete)."""
    events: list[tuple[str, dict]] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append((kind, {"type": kind, "sequence_number": len(events), **fields}))

    emit("response.created", response={**response, "status": "in_progress", "output": [],
                                       "incomplete_details": None, "usage": None})
    for at, item in enumerate(response["output"]):
        where = {"item_id": item["id"], "output_index": at}
        if item["type"] == "message":
            emit("response.output_item.added", output_index=at, item={**item, "status": "in_progress", "content": []})
            part = item["content"][0]
            emit("response.content_part.added", **where, content_index=0, part={**part, "text": ""})
            if part["text"]:
                emit("response.output_text.delta", **where, content_index=0, delta=part["text"], logprobs=[])
            emit("response.output_text.done", **where, content_index=0, text=part["text"], logprobs=[])
            emit("response.content_part.done", **where, content_index=0, part=part)
        else:
            emit("response.output_item.added", output_index=at, item={**item, "status": "in_progress",
                                                                       "arguments": ""})
            emit("response.function_call_arguments.delta", **where, delta=item["arguments"])
            emit("response.function_call_arguments.done", **where, name=item["name"], arguments=item["arguments"])
        emit("response.output_item.done", output_index=at, item=item)
    emit("response.completed" if response["status"] == "completed" else "response.incomplete", response=response)
    return events
