"""The agent endpoint driven by the real `openai.AsyncOpenAI` client, on 127.0.0.1, over a hub."""

from __future__ import annotations

import asyncio
import json
import logging
import re

import openai
import pytest

from cadence.agents import AgentEndpoint
from cadence.agents.tool_calls import template_messages
from cadence.inference.hub import InferenceHub
from tests.agents.scripted import ScriptedEngine, tool_tokenizer

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
}}]


def tool_call_text(style: str) -> str:
    """How each family writes a call of add(a=2, b=3) (what its template renders back)."""
    if style == "qwen2":
        return '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    return '{"name": "add", "parameters": {"a": 2, "b": 3}}'


def calculator_reply(style: str):
    """A model that calls add when asked and answers with the tool's result once it has it."""
    def reply(prompt: str) -> str:
        result = re.search(r"(?:<tool_response>\n|ipython<\|end_header_id\|>\n\n)(\d+)", prompt)
        if result:
            return "the sum is " + result.group(1)
        return tool_call_text(style) if "add" in prompt.lower() else "hello there"
    return reply


def serve(style: str, agent, reply=None, **endpoint_kw):
    """Run `agent(endpoint, engine)` against an endpoint served on the hub's loop; its result."""
    tok = tool_tokenizer(style)
    engine = ScriptedEngine(tok, reply or calculator_reply(style))
    hub = InferenceHub([engine])

    async def main():
        endpoint = AgentEndpoint(hub, tok, **endpoint_kw)
        await endpoint.start()
        try:
            return await agent(endpoint, engine, tok)
        finally:
            await endpoint.stop()

    return asyncio.run(hub.serving(main()))


def client_for(endpoint: AgentEndpoint, run: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=endpoint.run_url(run), api_key="unused", max_retries=0)


def render_ids(tok, messages, tools=None, generation_prompt=True) -> list[int]:
    messages = template_messages(messages)  # OpenAI messages in the HF convention templates expect
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=generation_prompt, tokenize=False)
    return tok.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("style", ["qwen2", "llama3"])
def test_chat_models_and_usage(style):
    async def agent(endpoint, engine, tok):
        run = endpoint.open_run()
        client = client_for(endpoint, run)
        models = await client.models.list()
        messages = [{"role": "user", "content": "hi"}]
        reply = await client.chat.completions.create(model="cadence", messages=messages, max_tokens=32,
                                                     temperature=0.7, top_p=0.9, stop=["zz"], logprobs=True)
        return models, reply, render_ids(tok, messages), engine.sampled

    models, reply, prompt_ids, sampled = serve(style, agent)
    assert [m.id for m in models.data] == ["cadence"]
    choice = reply.choices[0]
    assert choice.message.content == "hello there" and choice.finish_reason == "stop"
    assert reply.usage.prompt_tokens == len(prompt_ids) == len(sampled[0].prompt_ids)
    assert sampled[0].prompt_ids == prompt_ids
    assert [t.logprob for t in choice.logprobs.content] == sampled[0].logprobs


def test_stream_and_n():
    async def agent(endpoint, engine, tok):
        run = endpoint.open_run()
        client = client_for(endpoint, run)
        stream = await client.chat.completions.create(
            model="cadence", messages=[{"role": "user", "content": "hi"}], n=3, stream=True,
            stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
        return chunks, endpoint.close_run(run)

    chunks, trajectory = serve("qwen2", agent)
    text = {i: "" for i in range(3)}
    finish = {}
    for chunk in chunks:
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert text == {i: "hello there" for i in range(3)} and finish == {i: "stop" for i in range(3)}
    assert chunks[-1].usage.completion_tokens == 3 * len(trajectory.completions[0].result.token_ids)
    samples = trajectory.samples(1.0, 0, "task")
    assert len(samples) == 3  # three choices of one prompt: three samples, each id trained once


@pytest.mark.parametrize("style", ["qwen2", "llama3"])
def test_tool_call_round_trip_is_token_exact(style):
    async def agent(endpoint, engine, tok):
        run = endpoint.open_run()
        client = client_for(endpoint, run)
        messages = [{"role": "user", "content": "Please add 2 and 3."}]
        first = await client.chat.completions.create(model="cadence", messages=messages, tools=TOOLS)
        call = first.choices[0].message.tool_calls[0]
        result = str(sum(json.loads(call.function.arguments).values()))
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": result}]
        second = await client.chat.completions.create(model="cadence", messages=messages, tools=TOOLS)
        messages.append(second.choices[0].message.model_dump(exclude_none=True))
        return first, second, messages, endpoint.close_run(run), engine.sampled

    first, second, messages, trajectory, sampled = serve(style, agent)
    tok = tool_tokenizer(style)
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls" and first.choices[0].message.content is None
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
    assert second.choices[0].message.content == "the sum is 5"

    [sample] = trajectory.samples(1.0, 7, "task")
    assert trajectory.counts["stitched"] == 1
    model_ids = [t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m]
    model_mu = [lp for lp, m in zip(sample.behaviour_logprobs, sample.loss_mask, strict=True) if m]
    assert model_ids == sampled[0].token_ids + sampled[1].token_ids  # what the engine sampled, id for id
    assert model_mu == sampled[0].logprobs + sampled[1].logprobs
    assert all(lp == 0.0 for lp, m in zip(sample.behaviour_logprobs, sample.loss_mask, strict=True) if not m)
    # The first prompt, and the tool result as the template renders it, between the two replies.
    assert sample.prompt_ids == render_ids(tok, messages[:1], TOOLS)
    inserted = render_ids(tok, messages[:3], TOOLS)[len(sample.prompt_ids) + len(sampled[0].token_ids):]
    n0 = len(sampled[0].token_ids)
    assert sample.response_ids[n0:n0 + len(inserted)] == inserted
    assert sample.loss_mask == [1] * n0 + [0] * len(inserted) + [1] * len(sampled[1].token_ids)
    assert "5" in tok.decode(inserted)
    # The whole conversation, rendered by the template, is the trained sequence (plus the
    # template's trailer after the last end-of-turn token).
    whole = render_ids(tok, messages, TOOLS, generation_prompt=False)
    trained = sample.prompt_ids + sample.response_ids
    assert whole[: len(trained)] == trained and len(whole) - len(trained) <= 1


def test_history_rewrite_and_rerender_split_the_episode():
    def reply(prompt: str) -> str:
        return "<think>hm</think>four"

    # Qwen3-style: past assistant turns are rendered without their thinking.
    tok = tool_tokenizer("qwen2")
    tok.chat_template = tok.chat_template.replace(
        "'<|im_start|>assistant\\n' + message.content",
        "'<|im_start|>assistant\\n' + message.content.split('</think>')[-1]")

    async def agent(endpoint, engine, _):
        run = endpoint.open_run()
        client = client_for(endpoint, run)
        messages = [{"role": "user", "content": "2+2?"}]
        first = await client.chat.completions.create(model="cadence", messages=messages)
        messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "sure?"}]
        await client.chat.completions.create(model="cadence", messages=messages)  # rerender
        await client.chat.completions.create(model="cadence", messages=[{"role": "user", "content": "new"}])
        return endpoint.close_run(run), engine.sampled

    hub_engine = ScriptedEngine(tok, reply)
    hub = InferenceHub([hub_engine])

    async def main():
        endpoint = AgentEndpoint(hub, tok)
        await endpoint.start()
        try:
            return await agent(endpoint, hub_engine, tok)
        finally:
            await endpoint.stop()

    trajectory, sampled = asyncio.run(hub.serving(main()))
    assert trajectory.counts["rerender"] == 1 and trajectory.counts["rewrite"] == 1
    samples = trajectory.samples(0.5, 0, "task")
    assert len(samples) == 3 and {s.reward for s in samples} == {0.5}
    for sample, result in zip(samples, sampled, strict=True):
        assert sample.prompt_ids == result.prompt_ids and sample.response_ids == result.token_ids


def test_runs_are_attributed_by_key_and_strict_refuses_strangers():
    async def agent(endpoint, engine, tok):
        a, b = endpoint.open_run(), endpoint.open_run()
        by_key = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=b, max_retries=0)
        await by_key.chat.completions.create(model="cadence", messages=[{"role": "user", "content": "x"}])
        stranger = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key="nobody", max_retries=0)
        with pytest.raises(openai.AuthenticationError, match="no open agent run 'nobody'"):
            await stranger.chat.completions.create(model="cadence", messages=[{"role": "user", "content": "x"}])
        with pytest.raises(openai.BadRequestError, match=r"temperature must be in \[0, 2\]"):
            await by_key.chat.completions.create(model="cadence", messages=[{"role": "user", "content": "x"}],
                                                 temperature=-1)
        return endpoint.close_run(a), endpoint.close_run(b)

    a, b = serve("qwen2", agent)
    assert a.counts["requests"] == 0 and b.counts["requests"] == 1


def test_completions_with_logprobs():
    async def agent(endpoint, engine, tok):
        client = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key="anyone", max_retries=0)
        out = await client.completions.create(model="cadence", prompt="say hi", logprobs=1, max_tokens=8)
        stream = await client.completions.create(model="cadence", prompt=[5, 6, 7], stream=True, n=2)
        texts = [c.choices[0].text async for c in stream]
        return out, texts, engine.sampled

    out, streamed, sampled = serve("llama3", agent, strict=False)
    choice = out.choices[0]
    assert choice.text == "hello there"
    assert choice.logprobs.token_logprobs == sampled[0].logprobs
    assert out.usage.prompt_tokens == len(sampled[0].prompt_ids) == len("say hi")
    assert streamed == ["hello there", "hello there"] and sampled[1].prompt_ids == [5, 6, 7]


def test_a_prompt_beyond_the_context_is_a_named_error():
    async def agent(endpoint, engine, tok):
        run = endpoint.open_run()
        with pytest.raises(openai.BadRequestError, match="shorten the conversation or lower max_tokens"):
            await client_for(endpoint, run).chat.completions.create(
                model="cadence", messages=[{"role": "user", "content": "x" * 100}], max_tokens=10)
        return engine.sampled

    assert serve("qwen2", agent, max_context_tokens=64) == []


def test_a_client_that_hangs_up_mid_request_is_counted_not_logged_as_an_app_error():
    """A run cancelled while its request was being sent (a stop, a stale group): the server's
    read of the body fails; that is counted, not an 'Exception in ASGI application'."""
    logged: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append(record.getMessage())

    async def agent(endpoint, engine, tok):
        logging.getLogger("uvicorn.error").addHandler(Keep())  # uvicorn's loggers do not propagate
        run = endpoint.open_run()
        reader, writer = await asyncio.open_connection("127.0.0.1", endpoint.port)
        writer.write(f"POST /runs/{run}/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{endpoint.port}\r\n"
                     "Content-Type: application/json\r\n"
                     "Content-Length: 1000\r\n\r\n{\"messages\": ".encode())
        await writer.drain()
        while endpoint.counts["requests"] == 0:  # the handler is reading the body
            await asyncio.sleep(0.01)
        writer.close()
        await writer.wait_closed()
        while endpoint.counts["disconnected"] == 0 and not logged:
            await asyncio.sleep(0.01)
        return endpoint.counts

    counts = serve("qwen2", agent)
    assert not [line for line in logged if "Exception in ASGI application" in line]
    assert counts["disconnected"] == 1 and counts["errors"] == 0


def test_serving_is_true_only_once_the_port_is_known():
    """`serving` turned true as uvicorn started, before start() had read the port it bound: a
    caller that waited for it built its run URL with port 0."""
    tok = tool_tokenizer("qwen2")
    endpoint = AgentEndpoint(InferenceHub([ScriptedEngine(tok, lambda prompt: "hi")]), tok)

    async def main() -> int:
        starting = asyncio.ensure_future(endpoint.start())
        while not endpoint.serving and not starting.done():
            await asyncio.sleep(0)
        port = endpoint.port
        await starting
        await endpoint.stop()
        return port

    assert asyncio.run(main()) != 0
    assert not endpoint.serving
