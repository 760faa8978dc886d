"""`POST /v1/responses` driven by the real `openai` client's `responses` API, over a scripted engine."""

from __future__ import annotations

import json

import openai
import pytest

from cadence.agents import messages_api, responses_api, wire
from cadence.inference.types import GenResult
from tests.agents.scripted import tool_tokenizer
from tests.agents.test_endpoint import TOOLS, calculator_reply, client_for, render_ids, serve

RESPONSES_TOOLS = [{"type": "function", **TOOLS[0]["function"]}]
ASK = "Please add 2 and 3."


def calculator_saying(style: str, preamble: str):
    """`calculator_reply` with `preamble` written before its call (Hermes: text before the block is
    the reply's content; a Llama 3 call is the whole reply)."""
    plain = calculator_reply(style)

    def reply(prompt: str) -> str:
        text = plain(prompt)
        return f"{preamble}\n{text}" if preamble and text.startswith("<tool_call>") else text
    return reply


@pytest.mark.parametrize("preamble", ["", "Let me add."])
def test_a_function_call_round_trip_is_token_exact(preamble):
    async def agent(endpoint, engine, tok):
        run = endpoint.open_run()
        client = client_for(endpoint, run)
        first = await client.responses.create(model="cadence", input=ASK, tools=RESPONSES_TOOLS,
                                              instructions="Be brief.", max_output_tokens=64, temperature=0.5)
        call = first.output[-1]
        items = [{"role": "user", "content": [{"type": "input_text", "text": ASK}]},
                 *[item.model_dump(exclude_none=True) for item in first.output],
                 {"type": "function_call_output", "call_id": call.call_id,
                  "output": str(sum(json.loads(call.arguments).values()))}]
        second = await client.responses.create(model="cadence", input=items, tools=RESPONSES_TOOLS,
                                               instructions="Be brief.")
        return first, second, endpoint.close_run(run), engine.sampled

    first, second, trajectory, sampled = serve("qwen2", agent, reply=calculator_saying("qwen2", preamble))
    call = first.output[-1]
    assert first.output_text == preamble and len(first.output) == 1 + bool(preamble)
    assert (call.type, call.name, json.loads(call.arguments)) == ("function_call", "add", {"a": 2, "b": 3})
    assert first.status == "completed" and first.usage.output_tokens == len(sampled[0].token_ids)
    assert second.output_text == "the sum is 5" and second.output[0].type == "message"

    # The same conversation as chat messages renders the same ids, and stitches into one sample.
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": ASK},
                {"role": "assistant", "content": preamble or None, "tool_calls": [
                    {"id": call.call_id, "type": "function", "function": {"name": "add", "arguments": call.arguments}}]},
                {"role": "tool", "tool_call_id": call.call_id, "content": "5"}]
    assert_same_as_chat("qwen2", messages, trajectory, sampled)


def assert_same_as_chat(style: str, messages: list[dict], trajectory, sampled) -> None:
    """A two-turn conversation (system, user, tool call, tool result) as chat messages renders the
    ids each request was sampled from, and the run is one sample of exactly the sampled ids."""
    tok = tool_tokenizer(style)
    assert sampled[0].prompt_ids == render_ids(tok, messages[:2], TOOLS)
    assert sampled[1].prompt_ids == render_ids(tok, messages, TOOLS)
    [sample] = trajectory.samples(1.0, 0, "task")
    assert trajectory.counts["stitched"] == 1
    model_ids = [t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m]
    assert model_ids == sampled[0].token_ids + sampled[1].token_ids


@pytest.mark.parametrize("style", ["qwen2", "llama3"])
def test_streamed_events_build_the_same_response(style):
    async def agent(endpoint, engine, tok):
        client = client_for(endpoint, endpoint.open_run())
        stream = await client.responses.create(model="cadence", input=ASK, tools=RESPONSES_TOOLS, stream=True)
        events = [event async for event in stream]
        async with client.responses.stream(model="cadence", input="hi") as text_stream:
            deltas = [e.delta async for e in text_stream if e.type == "response.output_text.delta"]
            final = await text_stream.get_final_response()
        return events, deltas, final

    events, deltas, final = serve(style, agent)
    assert [e.type for e in events] == [
        "response.created", "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-1].response
    assert done.output[0].name == "add" and json.loads(events[3].arguments) == {"a": 2, "b": 3}
    assert deltas == ["hello there"] and final.output_text == "hello there" and final.usage.output_tokens > 0


def test_bad_fields_and_strangers_are_errors_the_client_raises():
    async def agent(endpoint, engine, tok):
        client = client_for(endpoint, endpoint.open_run())
        with pytest.raises(openai.BadRequestError, match="previous_response_id is not supported"):
            await client.responses.create(model="cadence", input="hi", previous_response_id="resp_1")
        with pytest.raises(openai.BadRequestError, match=r"tools\[0\] is not served"):
            await client.responses.create(model="cadence", input="hi", tools=[{"type": "web_search"}])
        with pytest.raises(openai.BadRequestError, match=r"max_output_tokens must be in \[1, 4096\]"):
            await client.responses.create(model="cadence", input="hi", max_output_tokens=10**6)
        with pytest.raises(openai.BadRequestError, match=r"input\[0\]"):
            await client.responses.create(model="cadence", input=[{"type": "reasoning", "summary": []}])
        stranger = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key="nobody", max_retries=0)
        with pytest.raises(openai.AuthenticationError, match="no open agent run 'nobody'"):
            await stranger.responses.create(model="cadence", input="hi")
        return engine.sampled

    assert serve("qwen2", agent) == []


def test_a_reply_cut_by_max_tokens_says_so_in_both_apis():
    """The scripted engine always ends its reply; a cut one is built here."""
    cut = GenResult("r", [1, 2], [5, 6, 7], [-0.1] * 3, "length", "hel", 0, 0)
    limits = wire.RequestLimits()
    request = responses_api.parse({"input": "hi", "max_output_tokens": 3}, limits)
    response = json.loads(responses_api.answer(request, "m", [1, 2], cut, ("hel", [])).body)
    assert (response["status"], response["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    assert responses_api.stream_events(response)[-1][0] == "response.incomplete"
    request = messages_api.parse({"max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}, limits)
    message = json.loads(messages_api.answer(request, "m", [1, 2], cut, ("hel", []), "hel").body)
    assert (message["stop_reason"], message["content"]) == ("max_tokens", [{"type": "text", "text": "hel"}])
