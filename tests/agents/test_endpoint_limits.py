"""The agent endpoint and `cadence serve` against hostile requests and replies (issue 33, findings
5-10): each is answered with a named 4xx (or, for the model's own text, a 200) and the endpoint
keeps serving; none is a 500, a hang or a body read in full."""

from __future__ import annotations

import asyncio
import json

import httpx

from cadence.agents import AgentEndpoint
from cadence.inference.hub import InferenceHub
from tests.agents.scripted import ScriptedEngine, tool_tokenizer

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
DEEP = "[" * 5_000 + "]" * 5_000  # past the recursion limit (1000), as 100 000 was
NESTED_CALL = '<tool_call>{"name": "add", "arguments": ' + DEEP + "}</tool_call>"


def reply(prompt: str) -> str:
    if "boom" in prompt:
        raise IndexError("index out of range in self")  # what an engine's embedding lookup raised
    return NESTED_CALL if "nest" in prompt else "hello"


def serve(requests, **endpoint_kw) -> list[httpx.Response]:
    """Send `requests(port)` -> [(method, path, kwargs)] in order; their responses."""
    tok = tool_tokenizer("qwen2")
    hub = InferenceHub([ScriptedEngine(tok, reply)])

    async def main():
        endpoint = AgentEndpoint(hub, tok, strict=False, **endpoint_kw)
        await endpoint.start()
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{endpoint.port}", timeout=60) as http:
                return [await http.request(method, path, **kw) for method, path, kw in requests(endpoint.port)]
        finally:
            await endpoint.stop()

    return asyncio.run(hub.serving(main()))


def chat(content: str = "hi", **fields) -> tuple[str, str, dict]:
    return "POST", "/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": content}], **fields}}


def error_of(response: httpx.Response) -> tuple[int, str | None, str]:
    error = response.json()["error"]
    return response.status_code, error["param"], error["message"]


def test_a_deeply_nested_tool_call_is_text_and_nested_json_a_400():
    """#5: the model's nested call comes back as its text (200), an agent's nested arguments or
    body is a 400 naming it; before, each was a RecursionError (500) and the run was lost."""
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "c1", "type": "function", "function": {"name": "add", "arguments": DEEP}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "5"}]
    body = '{"messages": ' + DEEP + "}"
    answers = serve(lambda port: [
        chat("please nest", tools=TOOLS),
        ("POST", "/v1/chat/completions", {"json": {"messages": history, "tools": TOOLS}}),
        ("POST", "/v1/chat/completions", {"content": body, "headers": {"content-type": "application/json"}}),
        chat("hi"),
    ])
    assert answers[0].status_code == 200
    message = answers[0].json()["choices"][0]["message"]
    assert message["content"] == NESTED_CALL and "tool_calls" not in message
    assert answers[1].status_code == 200  # the arguments string goes to the template as the agent sent it
    assert error_of(answers[2])[:2] == (400, "body") and "nested deeper than" in error_of(answers[2])[2]
    assert answers[3].status_code == 200


def test_only_local_programs_are_served():
    """#6: a DNS-rebinding page (foreign Host), a cross-site page (foreign Origin) and a
    `text/plain` form post are refused; the openai client's own requests are served."""
    answers = serve(lambda port: [
        ("GET", "/v1/models", {"headers": {"host": f"evil.example:{port}"}}),
        (*chat()[:2], {**chat()[2], "headers": {"host": f"evil.example:{port}"}}),
        (*chat()[:2], {**chat()[2], "headers": {"origin": "http://evil.example"}}),
        (*chat()[:2], {**chat()[2], "headers": {"origin": "null"}}),
        ("POST", "/v1/chat/completions", {"content": json.dumps(chat()[2]["json"]),
                                          "headers": {"content-type": "text/plain"}}),
        (*chat()[:2], {**chat()[2], "headers": {"origin": f"http://localhost:{port}"}}),
        ("GET", "/v1/models", {}),
        chat(),
    ])
    assert [a.status_code for a in answers] == [421, 421, 403, 403, 415, 200, 200, 200]
    assert "DNS rebinding" in error_of(answers[0])[2]


def test_an_out_of_vocabulary_token_id_is_a_400_and_the_endpoint_keeps_serving():
    """#7: refused at the door, naming the field; before, the engine raised and the hub died."""
    answers = serve(lambda port: [
        ("POST", "/v1/completions", {"json": {"prompt": [1, 2, 10**9]}}),
        ("POST", "/v1/completions", {"json": {"prompt": [-1]}}),
        ("POST", "/v1/completions", {"json": {"prompt": [1, 2, 3], "max_tokens": 4}}),
    ])
    assert error_of(answers[0])[:2] == (400, "prompt") and "token id 1000000000" in error_of(answers[0])[2]
    assert error_of(answers[1])[:2] == (400, "prompt")
    assert answers[2].status_code == 200


def test_an_engine_that_raises_fails_that_request_and_the_endpoint_keeps_serving():
    """#7: the hub contains an engine's exception: that request is a 500 naming it, the next is
    served (before, `InferenceHub.serve` died and every later request hung)."""
    answers = serve(lambda port: [chat("boom"), chat("hi")])
    status, _, message = error_of(answers[0])
    assert status == 500 and "IndexError: index out of range" in message
    assert answers[1].status_code == 200


BAD_FIELDS = [  # (fields, the field the 400 names, what its message says)
    ({"temperature": 1e-40}, "temperature", "below 0.01"),
    ({"temperature": 2.5}, "temperature", "[0, 2]"),
    ({"temperature": -1}, "temperature", "[0, 2]"),
    ({"top_p": 0}, "top_p", "(0, 1]"),
    ({"top_p": 1.5}, "top_p", "[0, 1]"),
    ({"n": 200_000}, "n", "max_n"),
    ({"n": 0}, "n", "[1, 16]"),
    ({"max_tokens": 10**9}, "max_tokens", "max_tokens_limit"),
    ({"max_completion_tokens": 10**9}, "max_completion_tokens", "max_tokens_limit"),
    ({"max_tokens": "many"}, "max_tokens", "must be a number"),
    ({"n": 1.5}, "n", "whole number"),
]


def test_sampling_fields_are_bounded_where_they_enter():
    """#8 and #9: each out-of-range field is a 400 naming it (and the setting that caps it); a
    request within the bounds is served after them."""
    answers = serve(lambda port: [chat(**fields) for fields, _, _ in BAD_FIELDS] + [
        chat(n=2, temperature=0.01, max_tokens=8)])
    for answer, (fields, param, says) in zip(answers, BAD_FIELDS, strict=False):
        status, named, message = error_of(answer)
        assert (status, named) == (400, param) and says in message, fields
    assert answers[-1].status_code == 200 and len(answers[-1].json()["choices"]) == 2


def test_non_finite_numbers_are_not_json():
    answers = serve(lambda port: [("POST", "/v1/chat/completions", {
        "content": '{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        "headers": {"content-type": "application/json"}})])
    assert error_of(answers[0])[:2] == (400, "body") and "NaN is not JSON" in error_of(answers[0])[2]


def test_the_caps_are_settings():
    answers = serve(lambda port: [chat(n=3), chat(max_tokens=40)], max_n=2, max_tokens_limit=32)
    assert [error_of(a)[1] for a in answers] == ["n", "max_tokens"]


def test_a_body_over_the_limit_is_a_413_before_it_is_read():
    """#10: by its Content-Length, and sent in chunks once the chunks pass the limit."""
    big = json.dumps({"messages": [{"role": "user", "content": "x" * (2 << 20)}]}).encode()

    async def chunks():
        for at in range(0, len(big), 1 << 16):
            yield big[at:at + (1 << 16)]

    answers = serve(lambda port: [
        ("POST", "/v1/chat/completions", {"content": big, "headers": {"content-type": "application/json"}}),
        ("POST", "/v1/chat/completions", {"content": chunks(), "headers": {"content-type": "application/json"}}),
        chat(),
    ], max_body_mb=1)
    assert [a.status_code for a in answers] == [413, 413, 200]
    assert "max_body_mb" in answers[0].json()["detail"]
