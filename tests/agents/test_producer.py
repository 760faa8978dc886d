"""AgentProducer driven directly: groups of agent runs through the endpoint, token-exact samples."""

from __future__ import annotations

import asyncio
import json

from cadence.agents import AgentEndpoint
from cadence.agents.producer import AgentProducer
from cadence.inference.hub import InferenceHub
from cadence.rollout.producer import TrainedKeys
from tests.agents.scripted import ScriptedEngine, tool_tokenizer
from tests.agents.test_endpoint import TOOLS, calculator_reply


async def calculator_agent(client, task) -> dict:
    """An agent written against the plain openai SDK: ask, run the tool it calls, answer."""
    messages = [{"role": "user", "content": f"Please add {task['a']} and {task['b']}."}]
    reply = await client.chat.completions.create(model="cadence", messages=messages, tools=TOOLS)
    message = reply.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or []:
        args = json.loads(call.function.arguments)
        messages.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})
    final = await client.chat.completions.create(model="cadence", messages=messages, tools=TOOLS)
    return {"reward": float(final.choices[0].message.content.endswith("5")), "turns": 2}


def play(agent, tasks, keys, group_size=3):
    tok = tool_tokenizer("qwen2")
    engine = ScriptedEngine(tok, calculator_reply("qwen2"))
    hub = InferenceHub([engine])
    producer = AgentProducer(AgentEndpoint(hub, tok), agent, tasks, group_size, eval_tasks=tasks)

    async def main():
        groups = [await producer.play(producer.next_key(), gid) for gid in range(keys)]
        evaluation = await producer.evaluate(2)
        await producer.cancel()
        await producer.endpoint.stop()
        return groups, evaluation

    groups, evaluation = asyncio.run(hub.serving(main()))
    return producer, engine, groups, evaluation


def test_groups_of_agent_runs_are_token_exact_samples():
    producer, engine, groups, evaluation = play(calculator_agent, [{"a": 2, "b": 3}], keys=2)
    assert [len(g.samples) for g in groups] == [3, 3] and [g.group_id for g in groups] == [0, 1]
    sampled = {tuple(r.token_ids) for r in engine.sampled}
    for sample in (s for g in groups for s in g.samples):
        assert sample.reward == 1.0 and sample.loss_mask.count(0) > 0
        model = [t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m]
        first_reply = len(engine.sampled[0].token_ids)
        assert tuple(model[:first_reply]) in sampled and tuple(model[first_reply:]) in sampled
    assert evaluation.pass_at_1 == 1.0
    metrics = producer.metrics()
    assert metrics["agent/runs_total"] == 6 + 2 and metrics["agent/stitched"] == 8
    state = producer.state_dict(TrainedKeys(2))
    assert producer.load_state_dict(state).below == 2


def test_failing_and_silent_agents_are_lost_not_trained():
    async def flaky(client, task):
        flaky.calls += 1
        if flaky.calls % 2:
            raise RuntimeError("tool crashed")
        return await calculator_agent(client, task)
    flaky.calls = 0

    async def silent(client, task):
        return 1.0

    producer, _, [group], _ = play(flaky, [{"a": 2, "b": 3}], keys=1, group_size=4)
    assert len(group.samples) == 2 and producer.counts["runs_lost"] == 2 + 1  # and one of the 2 evaluation runs
    assert "tool crashed" in producer.first_failure
    producer, _, [group], _ = play(silent, [{"a": 1, "b": 1}], keys=1)
    assert group is None and producer.counts["groups_dropped"] == 1
