"""`POST /v1/messages` driven by the real `anthropic` client, over a scripted engine."""

from __future__ import annotations

import json

import anthropic
import pytest

from tests.agents import test_endpoint_limits as limits
from tests.agents.test_endpoint import TOOLS, calculator_reply, serve
from tests.agents.test_responses_api import assert_same_as_chat, calculator_saying

ANTHROPIC_TOOLS = [{"name": "add", "description": TOOLS[0]["function"]["description"],
                    "input_schema": TOOLS[0]["function"]["parameters"]}]
ASK = "Please add 2 and 3."


def client_for(endpoint, run: str) -> anthropic.AsyncAnthropic:
    # The anthropic client's base_url has no /v1: it posts to base_url + "/v1/messages".
    return anthropic.AsyncAnthropic(base_url=endpoint.run_url(run).removesuffix("/v1"), api_key="unused",
                                    max_retries=0)


@pytest.mark.parametrize(("style", "preamble"), [("qwen2", ""), ("llama3", ""), ("qwen2", "Let me add.")])
def test_a_tool_use_round_trip_is_token_exact(style, preamble):
    async def agent(endpoint, engine, tok):
        run = endpoint.open_run()
        client = client_for(endpoint, run)
        messages = [{"role": "user", "content": ASK}]
        first = await client.messages.create(model="cadence", max_tokens=64, system="Be brief.",
                                             messages=messages, tools=ANTHROPIC_TOOLS,
                                             extra_body={"temperature": 0.5})  # not in this client's signature
        use = first.content[-1]
        messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                   "content": [{"type": "text", "text": str(sum(use.input.values()))}]}]}]
        second = await client.messages.create(model="cadence", max_tokens=64, system=[{"type": "text",
                                              "text": "Be brief."}], messages=messages, tools=ANTHROPIC_TOOLS)
        return first, second, endpoint.close_run(run), engine.sampled

    first, second, trajectory, sampled = serve(style, agent, reply=calculator_saying(style, preamble))
    use = first.content[-1]
    assert [b.text for b in first.content if b.type == "text"] == ([preamble] if preamble else [])
    assert (use.type, use.name, use.input, first.stop_reason) == ("tool_use", "add", {"a": 2, "b": 3}, "tool_use")
    assert first.usage.output_tokens == len(sampled[0].token_ids)
    assert first.usage.input_tokens == len(sampled[0].prompt_ids)
    assert [b.text for b in second.content] == ["the sum is 5"] and second.stop_reason == "end_turn"

    # The same conversation as chat messages renders the same ids, and stitches into one sample.
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": ASK},
                {"role": "assistant", "content": preamble or None, "tool_calls": [
                    {"id": use.id, "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
                {"role": "tool", "tool_call_id": use.id, "content": "5"}]
    assert_same_as_chat(style, messages, trajectory, sampled)


def test_streams_build_the_same_message():
    async def agent(endpoint, engine, tok):
        client = client_for(endpoint, endpoint.open_run())
        raw = await client.messages.create(model="cadence", max_tokens=64, stream=True, tools=ANTHROPIC_TOOLS,
                                           messages=[{"role": "user", "content": ASK}])
        events = [event async for event in raw]
        async with client.messages.stream(model="cadence", max_tokens=64, tools=ANTHROPIC_TOOLS,
                                          messages=[{"role": "user", "content": ASK}]) as stream:
            called = await stream.get_final_message()
        async with client.messages.stream(model="cadence", max_tokens=64,
                                          messages=[{"role": "user", "content": "hi"}]) as stream:
            texts = [text async for text in stream.text_stream]
            said = await stream.get_final_message()
        return events, called, texts, said

    events, called, texts, said = serve("qwen2", agent)
    assert [e.type for e in events] == ["message_start", "content_block_start", "content_block_delta",
                                        "content_block_stop", "message_delta", "message_stop"]
    assert events[2].delta.type == "input_json_delta" and events[4].delta.stop_reason == "tool_use"
    assert (called.content[0].name, called.content[0].input, called.stop_reason) == ("add", {"a": 2, "b": 3},
                                                                                      "tool_use")
    assert texts == ["hello there"] and said.content[0].text == "hello there" and said.stop_reason == "end_turn"
    assert said.usage.output_tokens > 0


def test_errors_the_client_raises_and_runs_named_by_x_api_key():
    def reply(prompt: str) -> str:
        return "done STOP more" if "halt" in prompt else calculator_reply("qwen2")(prompt)

    async def agent(endpoint, engine, tok):
        run = endpoint.open_run()
        client = client_for(endpoint, run)
        hi = [{"role": "user", "content": "hi"}]
        with pytest.raises(anthropic.BadRequestError, match=r"temperature must be in \[0, 1\]"):
            await client.messages.create(model="cadence", max_tokens=8, messages=hi, extra_body={"temperature": 1.5})
        with pytest.raises(anthropic.BadRequestError, match=r"messages\[0\].content\[0\] must be a text block"):
            await client.messages.create(model="cadence", max_tokens=8, messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
        with pytest.raises(anthropic.BadRequestError, match="max_tokens is required"):
            await client.post("/v1/messages", body={"model": "cadence", "messages": hi}, cast_to=object)
        stopped = await client.messages.create(model="cadence", max_tokens=8, stop_sequences=["STOP"],
                                               messages=[{"role": "user", "content": "halt"}])
        stranger = anthropic.AsyncAnthropic(base_url=f"http://127.0.0.1:{endpoint.port}", api_key="nobody",
                                            max_retries=0)
        with pytest.raises(anthropic.AuthenticationError, match="no open agent run 'nobody'"):
            await stranger.messages.create(model="cadence", max_tokens=8, messages=hi)
        by_header = anthropic.AsyncAnthropic(base_url=f"http://127.0.0.1:{endpoint.port}", api_key=None,
                                             auth_token=None, default_headers={"x-api-key": run}, max_retries=0)
        await by_header.messages.create(model="cadence", max_tokens=8, messages=hi)
        return stopped, endpoint.close_run(run)

    stopped, trajectory = serve("qwen2", agent, reply=reply)
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "STOP")
    assert trajectory.counts["requests"] == 2  # the stopped one and the one named by x-api-key


def test_the_endpoint_guards_hold_on_both_routes():
    """Host, body size and JSON nesting are checked before either route reads a field; a model's
    unparseable call comes back as text."""
    hi = {"max_tokens": 8, "input": "hi", "messages": [{"role": "user", "content": "hi"}]}
    nested = {"content": '{"messages": ' + limits.DEEP + "}", "headers": {"content-type": "application/json"}}
    big = {"content": json.dumps({**hi, "input": "x" * (2 << 20)}), "headers": {"content-type": "application/json"}}
    routes = ("/v1/responses", "/v1/messages")
    answers = limits.serve(lambda port: [
        *[("POST", path, {"json": hi, "headers": {"host": f"evil.example:{port}"}}) for path in routes],
        *[("POST", path, nested) for path in routes],
        *[("POST", path, big) for path in routes],
        ("POST", "/v1/messages", {"json": {**hi, "messages": [{"role": "user", "content": "please nest"}],
                                           "tools": [{"name": "add", "input_schema": {"type": "object"}}]}}),
    ], max_body_mb=1)
    assert [a.status_code for a in answers] == [421, 421, 400, 400, 413, 413, 200]
    assert answers[2].json()["error"]["param"] == "body"
    assert answers[3].json()["type"] == "error" and "nested deeper than" in answers[3].json()["error"]["message"]
    assert answers[6].json()["content"] == [{"type": "text", "text": limits.NESTED_CALL}]
