"""A tool-calling agent written with the plain `openai` SDK: nothing in it knows about cadence.

    async def run(client, task) -> dict

`client` is an `openai.AsyncOpenAI` (cadence points it at its endpoint while
training; any OpenAI-compatible server works), `task` a dict with the
problem under "prompt" ("47*86=") and the right answer under "answer". The
agent offers the model one tool, `calc`, runs the calls the model makes and
sends back their results, until the model answers in plain text; the reward
is 1.0 when that answer is right, else 0.0 (returned with the number of tool
calls: {"reward": ..., "tool_calls": ...}). A run that is still calling tools
after `max_turns`, or whose next turn the server refuses (the conversation
outgrew the context), ends unsolved: 0.0, so training sees the habit.

Try it against any server: `python examples/agents/calculator_agent.py --base-url URL`.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import operator

import openai

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an arithmetic expression such as 47*86.",
        "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]},
    },
}

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.USub: operator.neg}


def calc(expr: str) -> str:
    """The tool: + - * on integers, evaluated without `eval`; a bad expression gives an error text."""
    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.operand))
        raise ValueError("only integers and + - *")
    try:
        return str(value(ast.parse(expr.strip(), mode="eval").body))
    except (SyntaxError, ValueError, RecursionError) as e:
        return f"error: {e}"


def run_tool(call) -> str:
    """What the model's tool call returns (an error text for a tool or arguments we do not have)."""
    try:
        arguments = json.loads(call.function.arguments)
    except json.JSONDecodeError:
        return "error: arguments are not JSON"
    if call.function.name != "calc" or not isinstance(arguments, dict) or not isinstance(arguments.get("expr"), str):
        return "error: call calc with {\"expr\": \"...\"}"
    return calc(arguments["expr"])


async def run(client: openai.AsyncOpenAI, task: dict, model: str = "cadence", temperature: float = 1.0,
              max_turns: int = 3, max_tokens: int = 64) -> dict:
    """One episode: chat, run the tool calls, chat again, until a plain answer (or `max_turns`)."""
    messages = [{"role": "user", "content": task["prompt"]}]
    calls = 0
    for _ in range(max_turns):
        try:
            reply = await client.chat.completions.create(
                model=model, messages=messages, tools=[CALC_TOOL], temperature=temperature, max_tokens=max_tokens,
            )
        except openai.BadRequestError:  # the server refused the turn (the talk outgrew the context): unsolved
            return {"reward": 0.0, "tool_calls": calls}
        message = reply.choices[0].message
        if not message.tool_calls:
            right = (message.content or "").strip() == str(task["answer"]).strip()
            return {"reward": 1.0 if right else 0.0, "tool_calls": calls}
        messages.append({
            "role": "assistant", "content": message.content,
            "tool_calls": [{"id": c.id, "type": "function",
                            "function": {"name": c.function.name, "arguments": c.function.arguments}}
                           for c in message.tool_calls],
        })
        calls += len(message.tool_calls)
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": run_tool(call)})
    return {"reward": 0.0, "tool_calls": calls}  # still calling tools after max_turns: no answer


async def _main() -> None:
    parser = argparse.ArgumentParser(description="Run the calculator agent once against an OpenAI-compatible server.")
    parser.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="cadence")
    parser.add_argument("--prompt", default="47*86=")
    parser.add_argument("--answer", default="4042")
    args = parser.parse_args()
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key="unused")
    print(await run(client, {"prompt": args.prompt, "answer": args.answer}, model=args.model))


if __name__ == "__main__":
    asyncio.run(_main())
