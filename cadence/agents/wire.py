"""The OpenAI wire format: request fields in, response and stream-chunk objects out.

Only what the endpoint serves: chat completions, (legacy) completions and
the model list. A field with a bad value raises `BadRequest` naming the field;
the endpoint answers it as an OpenAI error (HTTP 400), which the `openai`
client raises as `BadRequestError` with the same message.

Log-probs: engines return the sampled token's log-prob only, so
`top_logprobs` lists are empty whatever `top_logprobs` asks for.

Every field is bounded where it comes in (`RequestLimits`): `n` and
`max_tokens` by the endpoint's settings, token ids by the vocabulary,
`temperature` to 0 (greedy) or [0.01, 2] (OpenAI's range; below 0.01 the
logits overflow, and vLLM raises such values to 0.01), `top_p` to (0, 1].
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from cadence.inference.config import MIN_TEMPERATURE
from cadence.inference.types import GenResult, SamplingParams


class BadRequest(ValueError):
    def __init__(self, param: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status

    def body(self) -> dict:
        kind = {400: "invalid_request_error", 401: "authentication_error"}.get(self.status, "server_error")
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": None}}


MAX_TEMPERATURE = 2.0  # OpenAI's range is [0, 2]


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask for (agent.endpoint.* settings, `cadence serve` flags)."""

    default_max_tokens: int = 256  # a request that names no max_tokens
    max_tokens: int = 4096  # a request asking more is refused
    max_n: int = 16  # choices per request
    vocab_size: int | None = None  # token ids of a completions prompt must be below it


@dataclass
class Request:
    """The fields of a chat or completions request the endpoint acts on."""

    params: SamplingParams
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    messages: list[dict] = field(default_factory=list)  # chat
    tools: list[dict] | None = None  # chat
    tool_choice: Any = "auto"  # chat
    prompt: str | list[int] = ""  # completions


def parse_chat(body: dict, limits: RequestLimits) -> Request:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise BadRequest("messages", "messages must be a non-empty list of {role, content} objects")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise BadRequest("tools", "tools must be a list of {type: function, function: {...}} objects")
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    request = _common(body, limits, name)
    request.messages = messages
    request.tools = tools or None
    request.tool_choice = body.get("tool_choice") or "auto"
    request.logprobs = bool(body.get("logprobs"))
    return request


def parse_completion(body: dict, limits: RequestLimits) -> Request:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    ids = isinstance(prompt, list) and prompt and all(type(i) is int for i in prompt)
    if not (isinstance(prompt, str) or ids):
        raise BadRequest("prompt", "prompt must be one string or one list of token ids (batches: one request each)")
    if ids and limits.vocab_size is not None:
        bad = next((i for i in prompt if not 0 <= i < limits.vocab_size), None)
        if bad is not None:
            raise BadRequest("prompt", f"token id {bad} is not in the vocabulary: ids are 0 .. {limits.vocab_size - 1}")
    if body.get("echo"):
        raise BadRequest("echo", "echo is not supported: send echo=false")
    request = _common(body, limits, "max_tokens")
    request.prompt = prompt
    request.logprobs = body.get("logprobs") is not None
    return request


def _common(body: dict, limits: RequestLimits, max_tokens_field: str) -> Request:
    n = _number(body, "n", 1, int, 1, limits.max_n, "max_n")
    max_tokens = _number(body, max_tokens_field, limits.default_max_tokens, int, 1, limits.max_tokens,
                         "max_tokens_limit")
    temperature = _number(body, "temperature", 1.0, float, 0.0, MAX_TEMPERATURE)
    if 0 < temperature < MIN_TEMPERATURE:
        raise BadRequest("temperature", f"temperature {temperature!r} is below {MIN_TEMPERATURE} (the logits would "
                         "overflow): send 0 for greedy, or at least 0.01")
    top_p = _number(body, "top_p", 1.0, float, 0.0, 1.0)
    if top_p == 0:
        raise BadRequest("top_p", "top_p must be in (0, 1], got 0")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("stop", "stop must be a non-empty string or a list of them")
    params = SamplingParams(max_new_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=stop)
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("stream_options", "stream_options must be an object, e.g. {\"include_usage\": true}")
    return Request(params=params, n=n, stream=bool(body.get("stream")),
                   include_usage=bool(options.get("include_usage")))


def _number(body: dict, name: str, default: float, kind: type, low: float, high: float,
            setting: str | None = None) -> Any:
    """Field `name` of `body` as `kind`, in [low, high]; a 400 naming the field (and the setting
    that sets `high`) otherwise."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRequest(name, f"{name} must be a number, got {value!r}")
    if kind is int and value != int(value):
        raise BadRequest(name, f"{name} must be a whole number, got {value!r}")
    if not low <= value <= high:
        cap = f" (the endpoint's {setting} setting)" if setting else ""
        raise BadRequest(name, f"{name} must be in [{low:g}, {high:g}]{cap}, got {value!r}")
    return kind(value)


# -- responses ---------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def finish_reason(result: GenResult, tool_calls: list[dict]) -> str:
    if tool_calls:
        return "tool_calls"
    return "length" if result.finish_reason == "length" else "stop"


def usage(prompt_ids: list[int], results: list[GenResult]) -> dict:
    completion = sum(len(r.token_ids) for r in results)
    return {"prompt_tokens": len(prompt_ids), "completion_tokens": completion,
            "total_tokens": len(prompt_ids) + completion}


def chat_logprobs(tokens: list[str], result: GenResult) -> dict:
    return {"content": [
        {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
        for t, lp in zip(tokens, result.logprobs, strict=True)
    ]}


def completion_logprobs(tokens: list[str], result: GenResult) -> dict:
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": list(result.logprobs),
            "top_logprobs": [{} for _ in tokens], "text_offset": offsets}


def envelope(kind: str, request_id: str, model: str, choices: list[dict], usage_: dict | None) -> dict:
    out = {"id": request_id, "object": kind, "created": int(time.time()), "model": model, "choices": choices}
    if usage_ is not None:
        out["usage"] = usage_
    return out


def chat_chunks(request_id: str, model: str, choices: list[dict]) -> list[dict]:
    """A finished chat completion as stream chunks: per choice the role, its content (or tool
    calls) with its log-probs, then its finish reason."""
    chunks = []
    for choice in choices:
        index, message = choice["index"], choice["message"]
        chunks.append({"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})
        delta: dict = {}
        if message.get("content"):
            delta["content"] = message["content"]
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        if delta:
            chunks.append({"index": index, "delta": delta, "logprobs": choice.get("logprobs"), "finish_reason": None})
        chunks.append({"index": index, "delta": {}, "finish_reason": choice["finish_reason"]})
    return [envelope("chat.completion.chunk", request_id, model, [c], None) for c in chunks]


def completion_chunks(request_id: str, model: str, choices: list[dict]) -> list[dict]:
    return [envelope("text_completion", request_id, model, [c], None) for c in choices]
