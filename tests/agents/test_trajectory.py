"""Trajectory stitching rules and tool-call parsing, without a server."""

from __future__ import annotations

import json

from cadence.agents.tool_calls import detect_tool_format, parse_tool_calls
from cadence.agents.trajectory import Trajectory
from cadence.inference.types import GenResult
from tests.agents.scripted import LLAMA_TOOLS_TEMPLATE, QWEN_TOOLS_TEMPLATE
from tests.chat_models import QWEN2_TEMPLATE


def result(prompt: list[int], tokens: list[int], version: int = 0) -> GenResult:
    return GenResult("r", prompt, tokens, [-0.5] * len(tokens), "stop", "", version, version)


def test_branches_train_every_sampled_id_once():
    t = Trajectory("run")
    t.record([1, 2], [result([1, 2], [10, 11]), result([1, 2], [20, 21])], None)  # n = 2
    t.record([1, 2, 20, 21, 3], [result([1, 2, 20, 21, 3], [30], version=1)], None)  # continues choice 1
    t.record([1, 2, 20, 21, 3], [result([1, 2, 20, 21, 3], [40])], None)  # the same turn, retried
    samples = t.samples(2.0, 5, "task")
    trained = sorted(x for s in samples for x, m in zip(s.response_ids, s.loss_mask, strict=True) if m)
    assert trained == [10, 11, 20, 21, 30, 40]
    by_first = {s.response_ids[0]: s for s in samples}
    assert by_first[20].response_ids == [20, 21, 3, 30] and by_first[20].loss_mask == [1, 1, 0, 1]
    assert by_first[20].behaviour_logprobs == [-0.5, -0.5, 0.0, -0.5] and by_first[20].version == 0
    assert by_first[40].prompt_ids == [1, 2, 20, 21, 3]  # a branch: its history is prompt
    assert t.counts["stitched"] == 2 and {s.reward for s in samples} == {2.0}


def test_tool_call_formats_are_detected_and_parsed():
    assert detect_tool_format(QWEN_TOOLS_TEMPLATE) == "hermes"
    assert detect_tool_format(LLAMA_TOOLS_TEMPLATE) == "llama3_json"
    assert detect_tool_format(QWEN2_TEMPLATE) is None
    text = 'Let me look.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>' \
           '\n<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    content, calls = parse_tool_calls(text, "hermes")
    assert content == "Let me look." and [c["function"]["name"] for c in calls] == ["f", "g"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"x": 1}
    content, calls = parse_tool_calls('<|python_tag|>{"name": "f", "parameters": {"x": 2}}', "llama3_json")
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"x": 2}
    # Not a call (broken JSON, plain prose): the text comes back as content.
    assert parse_tool_calls("<tool_call>{oops</tool_call>", "hermes") == ("<tool_call>{oops</tool_call>", [])
    assert parse_tool_calls("the answer is 4", "llama3_json") == ("the answer is 4", [])
