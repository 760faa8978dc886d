"""AgentProducer driven directly: groups of agent runs through the endpoint, token-exact samples."""

from __future__ import annotations

import asyncio
import json

from cadence.agents import AgentEndpoint
from cadence.agents.producer import AgentProducer
from cadence.inference.hub import InferenceHub
from tests.agents.scripted import ScriptedEngine, tool_tokenizer
from tests.agents.test_endpoint import TOOLS, calculator_reply


async def ask_and_call_tools(client, task) -> list[dict]:
    """The first turn of an agent written against the plain openai SDK: ask, run the tools the
    model calls; the conversation so far."""
    messages = [{"role": "user", "content": f"Please add {task['a']} and {task['b']}."}]
    reply = await client.chat.completions.create(model="cadence", messages=messages, tools=TOOLS)
    message = reply.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or []:
        args = json.loads(call.function.arguments)
        messages.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})
    return messages


async def calculator_agent(client, task) -> dict:
    """Ask, run the tool it calls, answer."""
    messages = await ask_and_call_tools(client, task)
    final = await client.chat.completions.create(model="cadence", messages=messages, tools=TOOLS)
    return {"reward": float(final.choices[0].message.content.endswith("5")), "turns": 2}


def play(agent, tasks, keys, group_size=3, **options):
    tok = tool_tokenizer("qwen2")
    engine = ScriptedEngine(tok, calculator_reply("qwen2"))
    hub = InferenceHub([engine])
    producer = AgentProducer(AgentEndpoint(hub, tok), agent, tasks, group_size, eval_tasks=tasks, **options)

    async def main():
        groups = [await producer.play(key, key) for key in range(keys)]
        evaluation = await producer.evaluate(2)
        await producer.stop()
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


def test_failing_and_silent_agents_are_lost_not_trained():
    async def flaky(client, task):
        flaky.calls += 1
        if flaky.calls % 2:
            raise RuntimeError("tool crashed")
        return await calculator_agent(client, task)
    flaky.calls = 0

    async def silent(client, task):
        return 1.0

    producer, _, [group], _ = play(flaky, [{"a": 2, "b": 3}], keys=1, group_size=4, max_retries=0)
    assert len(group.samples) == 2 and producer.failures.lost == 2 + 1  # and one of the 2 evaluation runs
    [first] = producer.failures.health()["first_failures"].values()
    assert "tool crashed" in first and "test_producer.py" in first
    # With retries a lost run is replaced by another on the same task: the group fills up.
    flaky.calls = 0
    producer, _, [group], _ = play(flaky, [{"a": 2, "b": 3}], keys=1, group_size=4)
    assert len(group.samples) == 4 and producer.failures.retried == producer.failures.lost - 1
    producer, _, [group], _ = play(silent, [{"a": 1, "b": 1}], keys=1, max_retries=2)
    assert group is None and producer.failures.groups_dropped == 1 and producer.failures.lost == 3 + 2 + 2


async def summarising_agent(client, task) -> float:
    """Calls the tool, then rewrites its history (keeps a summary instead of the turns) when the
    task says so: such a run is two samples."""
    messages = await ask_and_call_tools(client, task)
    if task["summarise"]:
        messages = [{"role": "user", "content": f"The tool said {messages[-1]['content']}. Summary: add them."}]
    await client.chat.completions.create(model="cadence", messages=messages, tools=TOOLS)
    return 0.75


def test_a_run_that_rewrites_its_history_is_several_samples_with_its_whole_reward():
    """The weighting rule (producer.py docstring): each of a split run's k samples carries the run's
    whole reward, every sampled token is trained in exactly one of them (so under token-mean a
    token weighs the same split or not), and the group counts the k samples as members."""
    from cadence.train.batch import collate

    for summarise, pieces in ((False, 1), (True, 2)):
        producer, engine, [group], _ = play(summarising_agent, [{"a": 2, "b": 3, "summarise": summarise}],
                                            keys=1, group_size=3)
        assert len(group.samples) == 3 * pieces and producer.failures.played == 3 + 2  # and 2 eval runs
        rewards = {s.reward for s in group.samples}
        assert rewards == {0.75}  # never reward / k
        group_requests = engine.sampled[: 3 * 2]  # the group's 6 requests came before the evaluation's
        trained = sorted(t for s in group.samples for t, m in zip(s.response_ids, s.loss_mask, strict=True) if m)
        assert trained == sorted(t for r in group_requests for t in r.token_ids)
        batch = collate(group.samples, pad_id=0)
        assert int(batch.mask.sum()) == sum(len(r.token_ids) for r in group_requests)
        assert producer.endpoint.metrics()["agent/rewrite"] == (3 + 2 if summarise else 0)
