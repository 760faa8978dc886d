"""A coding agent with a bash tool, written with the plain `openai` SDK: nothing in it knows about cadence.

    async def run(client, task) -> dict

`client` is an `openai.AsyncOpenAI` (cadence points it at its endpoint while training; any
OpenAI-compatible server works). `task` is a dict with the problem statement under "prompt" and
the address of the run's sandbox, a shell in a copy of the task's repository: "sandbox_url" and
"sandbox_token" (a bearer token that reaches that sandbox only). The agent talks to it over HTTP
(`POST {sandbox_url}/exec` with `{"cmd": ...}`), as a scaffold in another process or language
would, so it needs nothing but the standard library and `openai`.

It shows the model the repository's files, offers it one tool, `bash`, runs the commands the model
asks for in the sandbox and sends back their output, until the model answers in plain text or
`max_turns` pass. It returns 0.0: the reward is cadence's grader's (the task's hidden tests, run on
a fresh copy of the repository with the run's changes), never the agent's own.

Try it against any server and sandbox service:
`python examples/agents/bash_agent.py --base-url URL --sandbox-url URL --sandbox-token TOKEN`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import urllib.request

import openai

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command in the repository's folder; returns its exit code and output.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    },
}


def sandbox_exec(url: str, token: str, cmd: str) -> dict:
    """One command in the sandbox: {exit_code, stdout, stderr, ...} (the sandbox service's /exec; the
    sandbox's own limits bound its time)."""
    request = urllib.request.Request(
        f"{url}/exec", json.dumps({"cmd": cmd}).encode(),
        {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)


async def bash(task: dict, cmd: str, max_output_chars: int) -> str:
    """What the bash tool returns to the model: the exit code, then stdout and stderr, cut short."""
    done = await asyncio.to_thread(sandbox_exec, task["sandbox_url"], task["sandbox_token"], cmd)
    output = f"exit code {done['exit_code']}\n{done['stdout']}{done['stderr']}"
    return output if len(output) <= max_output_chars else output[:max_output_chars] + "\n[output cut]"


def tool_command(call) -> str | None:
    """The command of a `bash` call, or None for a tool or arguments we do not have."""
    try:
        arguments = json.loads(call.function.arguments)
    except json.JSONDecodeError:
        return None
    if call.function.name != "bash" or not isinstance(arguments, dict) or not isinstance(arguments.get("cmd"), str):
        return None
    return arguments["cmd"]


async def run(client: openai.AsyncOpenAI, task: dict, model: str = "cadence", temperature: float = 1.0,
              max_turns: int = 8, max_tokens: int = 256, max_output_chars: int = 2000) -> dict:
    """One episode: the statement and the file list, then chat and run bash calls until a plain answer."""
    files = await bash(task, "find . -type f -not -path '*/.*' | sort", max_output_chars)
    messages = [{"role": "user", "content": f"{task['prompt']}\n\nFiles:\n{files}"}]
    commands = 0
    for _ in range(max_turns):
        try:
            reply = await client.chat.completions.create(
                model=model, messages=messages, tools=[BASH_TOOL], temperature=temperature, max_tokens=max_tokens,
            )
        except openai.BadRequestError:  # the server refused the turn (the talk outgrew the context): stop here
            break
        message = reply.choices[0].message
        if not message.tool_calls:
            break  # the model says it is done
        messages.append({
            "role": "assistant", "content": message.content,
            "tool_calls": [{"id": c.id, "type": "function",
                            "function": {"name": c.function.name, "arguments": c.function.arguments}}
                           for c in message.tool_calls],
        })
        for call in message.tool_calls:
            cmd = tool_command(call)
            commands += cmd is not None
            output = await bash(task, cmd, max_output_chars) if cmd is not None else \
                'error: call bash with {"cmd": "..."}'
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    return {"reward": 0.0, "commands": commands}


async def _main() -> None:
    parser = argparse.ArgumentParser(description="Run the bash agent once against an OpenAI-compatible server.")
    parser.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--sandbox-url", required=True, help="a sandbox's address on a sandbox service")
    parser.add_argument("--sandbox-token", required=True)
    parser.add_argument("--model", default="cadence")
    parser.add_argument("--prompt", default="Fix the failing test in this repository.")
    args = parser.parse_args()
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key="unused")
    task = {"prompt": args.prompt, "sandbox_url": args.sandbox_url, "sandbox_token": args.sandbox_token}
    print(await run(client, task, model=args.model))


if __name__ == "__main__":
    asyncio.run(_main())
