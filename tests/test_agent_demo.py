"""The agent demo: the `builtin:calc` asset, the example agent (plain `openai`), and its training run."""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import re
from pathlib import Path

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cadence.agents import AgentEndpoint
from cadence.agents.tool_calls import detect_tool_format
from cadence.inference.embedded import EmbeddedEngine
from cadence.inference.hub import InferenceHub
from cadence.models.loading import load_policy, load_tokenizer, resolve_model_path
from cadence.observe.metrics import read_jsonl
from tests.agents.scripted import ScriptedEngine

ROOT = Path(__file__).resolve().parent.parent
AGENT_FILE = ROOT / "examples" / "agents" / "calculator_agent.py"
ASSET = resolve_model_path("builtin:calc")


def load_file(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


agent = load_file("calculator_agent", AGENT_FILE)
maker = load_file("make_calc_tiny", ROOT / "scripts" / "make_calc_tiny.py")


def run_agents(hub, tok, rows: list[dict], context: int | None = None, **kwargs) -> list[tuple[dict, object]]:
    """The example agent on `rows` through a strict endpoint: (what it returned, its trajectory) each."""
    async def one(endpoint: AgentEndpoint, row: dict):
        run = endpoint.open_run()
        client = openai.AsyncOpenAI(base_url=endpoint.run_url(run), api_key=run, max_retries=0)
        try:
            returned = await agent.run(client, row, **kwargs)
        finally:
            await client.close()
        return returned, endpoint.close_run(run)

    async def main():
        endpoint = AgentEndpoint(hub, tok, max_context_tokens=context)
        await endpoint.start()
        try:
            return await asyncio.gather(*(one(endpoint, row) for row in rows))
        finally:
            await endpoint.stop()

    return asyncio.run(hub.serving(main()))


def test_the_calc_asset_loads_in_plain_transformers_and_writes_tool_calls_hermes_style():
    tok = AutoTokenizer.from_pretrained(ASSET)
    model = AutoModelForCausalLM.from_pretrained(ASSET)
    assert detect_tool_format(tok.chat_template) == "hermes"
    assert tok.eos_token == "<|im_end|>" and model.config.vocab_size == len(tok)
    call = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": {"expr": "47*86"}}}
    messages = [{"role": "user", "content": "47*86="},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": "4042"}]
    text = tok.apply_chat_template(messages, tools=[agent.CALC_TOOL], add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\ntools: calc(expr)<|im_end|>\n")
    assert '<tool_call>{"name": "calc", "arguments": {"expr": "47*86"}}</tool_call><|im_end|>' in text
    ids = tok.encode(text, add_special_tokens=False)
    # The tags are one token each and survive decoding without special tokens (the engine's text).
    assert ids.count(tok.convert_tokens_to_ids("<tool_call>")) == 1
    assert "<tool_call>" in tok.decode(ids, skip_special_tokens=True)
    assert model(input_ids=torch.tensor([ids])).logits.shape == (1, len(ids), len(tok))


def test_the_example_agent_imports_only_openai_and_the_standard_library():
    tree = ast.parse(AGENT_FILE.read_text())
    modules = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
               for alias in node.names}
    modules |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module}
    assert "cadence" not in modules and modules - {"__future__", "argparse", "ast", "asyncio", "json",
                                                   "operator"} == {"openai"}


def test_the_calc_tool_evaluates_integer_arithmetic_and_names_what_it_cannot():
    assert agent.calc("47*86") == "4042" and agent.calc(" -3 + 4*5 ") == "17"
    assert agent.calc("__import__('os')").startswith("error:")
    assert agent.calc("2**10").startswith("error:") and agent.calc("47*").startswith("error:")


def scripted_calculator(prompt: str) -> str:
    """A model that calls calc on the user's problem, then answers with the tool's result."""
    result = re.search(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", prompt)
    if result:
        return result.group(1)
    problem = re.search(r"<\|im_start\|>user\n(.*?)=<\|im_end\|>", prompt).group(1)
    return '<tool_call>{"name": "calc", "arguments": {"expr": "' + problem + '"}}</tool_call>'


def test_the_example_agent_runs_the_tool_and_trains_one_sequence_laid_out_as_the_warm_up_was():
    tok = load_tokenizer("builtin:calc")
    engine = ScriptedEngine(tok, scripted_calculator)
    rows = [{"prompt": "47*86=", "answer": "4042"}, {"prompt": "12*12=", "answer": "145"}]
    (right, first), (wrong, _) = run_agents(InferenceHub([engine]), tok, rows)
    assert right == {"reward": 1.0, "tool_calls": 1} and wrong == {"reward": 0.0, "tool_calls": 1}
    [sample] = first.samples(1.0, 0, "task-0")
    assert first.counts["stitched"] == 1 and first.counts["rerender"] == 0
    # The endpoint's sequence is the warm-up's transcript id for id, the loss on the same tokens.
    ids, mask = maker.encode_transcript(tok, maker.transcript("47*86=", "4042", use_tool=True))
    assert sample.prompt_ids + sample.response_ids == ids
    assert [0] * len(sample.prompt_ids) + list(sample.loss_mask) == mask


def test_a_plain_answer_ends_the_run_without_a_tool_call():
    tok = load_tokenizer("builtin:calc")
    outcomes = run_agents(InferenceHub([ScriptedEngine(tok, lambda prompt: "4042")]), tok,
                          [{"prompt": "47*86=", "answer": "4042"}, {"prompt": "47*87=", "answer": "4089"}])
    assert [o for o, _ in outcomes] == [{"reward": 1.0, "tool_calls": 0}, {"reward": 0.0, "tool_calls": 0}]


def test_a_model_that_only_calls_the_tool_is_not_rewarded_and_its_run_is_not_lost():
    """Calling for ever ends unsolved, at max_turns or where the server refuses a turn that no longer
    fits the context: the agent returns 0.0 (a lost run would hide the habit from training)."""
    tok = load_tokenizer("builtin:calc")
    call = '<tool_call>{"name": "calc", "arguments": {"expr": "47*86"}}</tool_call>'
    rows = [{"prompt": "47*86=", "answer": "4042"}]
    [(returned, trajectory)] = run_agents(InferenceHub([ScriptedEngine(tok, lambda prompt: call)]), tok, rows)
    assert returned == {"reward": 0.0, "tool_calls": 3} and trajectory.counts["requests"] == 3
    [(returned, trajectory)] = run_agents(InferenceHub([ScriptedEngine(tok, lambda prompt: call)]), tok, rows,
                                          context=200)
    assert returned == {"reward": 0.0, "tool_calls": 2} and trajectory.counts["requests"] == 2


def test_the_warmed_model_drives_the_example_agent_through_the_endpoint():
    tok = load_tokenizer("builtin:calc")
    hub = InferenceHub([EmbeddedEngine(load_policy("builtin:calc").eval(), tok, seed=0)])
    pairs = [(11 + 7 * k % 88, 97 - 5 * k % 86) for k in range(32)]
    rows = [{"prompt": f"{a:02d}*{b:02d}=", "answer": str(a * b)} for a, b in pairs]
    outcomes = run_agents(hub, tok, rows)
    called = [(o, t) for o, t in outcomes if o["tool_calls"]]
    assert called, "the warmed model never called the tool in 32 runs (it does on about 1 in 5)"
    for returned, trajectory in outcomes:
        assert returned["reward"] in (0.0, 1.0)
        # Every turn continues the one before it token for token: what the model wrote re-renders the same.
        assert trajectory.counts["rerender"] == 0 and trajectory.counts["rewrite"] == 0
        assert trajectory.counts["stitched"] == trajectory.counts["requests"] - 1
    assert sum(o["reward"] for o, _ in called) >= len(called) / 2  # the tool path mostly gets it right


def test_the_warm_up_transcripts_are_the_chat_template_rendering():
    tok = maker.calc_tokenizer()
    for use_tool in (True, False):
        messages = maker.transcript("05*61=", "305", use_tool)
        ids, mask = maker.encode_transcript(tok, messages)
        whole = tok.apply_chat_template(messages, tools=[agent.CALC_TOOL], tokenize=False)
        assert ids == tok.encode(whole, add_special_tokens=False)[: len(ids)]
        learned = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
        assert learned == ('<tool_call>{"name": "calc", "arguments": {"expr": "05*61"}}</tool_call><|im_end|>'
                           if use_tool else "") + "305<|im_end|>"


@pytest.mark.slow
def test_the_demo_config_trains_two_steps_and_evaluates_the_agent(tmp_path, monkeypatch):
    from cadence.config import load_config
    from cadence.recipes.train_rlvr import train

    monkeypatch.chdir(ROOT)  # the example names its agent by a path from the checkout's root
    cfg = load_config(str(ROOT / "examples" / "agents" / "calculator.yaml"), [
        "trainer.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=4", "task.test_size=4",
        "eval.every=0", "logging.progress=false", "logging.tensorboard=false", f"logging.run_dir={tmp_path}/run",
    ])
    summary = train(cfg)
    assert summary.eval_before.prompts == 4 and summary.eval_after.prompts == 4
    steps = read_jsonl(summary.run_dir / "metrics.jsonl")
    assert [r["step"] for r in steps if r["step"] > 0] == [1, 2]
    assert steps[-1]["agent/runs_lost_total"] == 0 and steps[-1]["agent/rerender"] == 0
    assert steps[-1]["progress/samples_total"] == 2 * 2 * 4  # 2 steps of 2 problems x 4 runs, one sample each
