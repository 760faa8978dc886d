"""Make `builtin:calc` (cadence/assets/calc-tiny): a tiny chat model that calls a calculator tool
only some of the time, the warmed-up model of the agent demo (examples/agents/).

    python scripts/make_calc_tiny.py                       # -> runs/sft-calc: the shipped weights bit for bit, ~14 min on 2 loaded cores
    python scripts/make_calc_tiny.py --output cadence/assets/calc-tiny --overwrite
    python scripts/make_calc_tiny.py --check cadence/assets/calc-tiny  # held-out success, tool-call rate

The tokenizer is the byte-level char tokenizer plus Qwen-style turn markers
(`<|im_start|>`, `<|im_end|>` = EOS) and `<tool_call>`/`</tool_call>` as
single tokens, with a chat template that shows the tools and writes tool calls
the Hermes way, so the endpoint detects the format by itself.

The data are transcripts of the agent in examples/agents/calculator_agent.py
on two-digit multiplications ("47*86=", the `arith` task's problems, never its
test split), rendered by that chat template: on `tool_rate` of them the
assistant calls `calc` and answers with its result; on the others it answers
straight away, the right product, which a model this small cannot compute in
its head (its guesses are mostly wrong). RL then has one decision to learn:
call the tool.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch
import yaml

from cadence.data.arithmetic import TERMINATOR, ArithmeticTask
from cadence.data.options import ArithOptions
from cadence.models.loading import load_policy
from cadence.models.tiny import char_tokenizer, tiny_model
from cadence.python_spec import load_python_object
from cadence.recipes.sft import Row, fit
from cadence.runtime.threads import configure_threads

# Qwen-style turns; tools listed as `name(arg, ...)` in a system turn; an assistant's tool calls
# as Hermes blocks right after its content. `tojson` keeps the keys in the order the call gave.
CHAT_TEMPLATE = (
    "{%- if tools -%}"
    "{{ '<|im_start|>system\\ntools:' }}"
    "{%- for tool in tools -%}"
    "{%- set f = tool.function if tool.function is defined else tool -%}"
    "{{ ' ' + f.name + '(' + (f.parameters.properties | default({}) | join(', ')) + ')' }}"
    "{%- endfor -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message.role + '\\n' + (message.content or '') }}"
    "{%- if message.role == 'assistant' and message.tool_calls -%}"
    "{%- for call in message.tool_calls -%}"
    "{%- set f = call.function if call.function is defined else call -%}"
    "{{ '<tool_call>' + ({'name': f.name, 'arguments': f.arguments} | tojson) + '</tool_call>' }}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

AGENT_FILE = Path(__file__).resolve().parent.parent / "examples" / "agents" / "calculator_agent.py"
# The tool the demo's agent offers, exactly as it sends it: the transcripts render the same system turn.
CALC_TOOL = load_python_object(f"python:{AGENT_FILE}:CALC_TOOL", "the demo agent's tool", kind="object")

SETTINGS = {  # what the shipped asset was made with (written beside it as sft_config.yaml)
    "seed": 0,
    "model": {"arch": "llama", "hidden_size": 64, "layers": 4, "heads": 4, "max_positions": 256},
    "task": {"name": "arith", "kwargs": {"operations": ["*"], "digits": 2}, "seed": 0},
    "tool_rate": 0.3,
    "examples": 20000,
    # Two passes over the same transcripts, each with its own warm-up and decay: the first learns
    # the format and the choice, the second (lower lr) the copying (expression into the call,
    # result into the answer), which the first leaves unreliable.
    "stages": [{"steps": 800, "lr": 0.003}, {"steps": 400, "lr": 0.0015}],
    "batch_size": 32,
    "threads": 1,
}


def calc_tokenizer():
    """The char tokenizer with turn markers, single-token tool-call tags and the chat template."""
    tok = char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    # Not special: the engine decodes replies without special tokens, and the tags must stay in the text.
    tok.add_tokens(["<tool_call>", "</tool_call>"])
    tok.eos_token = "<|im_end|>"
    tok.chat_template = CHAT_TEMPLATE
    return tok


def transcript(problem: str, answer: str, use_tool: bool) -> list[dict]:
    """The messages of one agent run on `problem` ("47*86="): a tool call and its result, or not."""
    messages = [{"role": "user", "content": problem}]
    if use_tool:
        call = {"type": "function", "function": {"name": "calc", "arguments": {"expr": problem.rstrip("=")}}}
        messages += [{"role": "assistant", "content": "", "tool_calls": [call]},
                     {"role": "tool", "content": answer}]
    return messages + [{"role": "assistant", "content": answer}]


def encode_transcript(tok, messages: list[dict]) -> Row:
    """Token ids of the whole run as the endpoint renders it; the loss on each assistant reply
    up to and including its `<|im_end|>` (what the model samples), nothing else."""
    ids: list[int] = []
    mask: list[int] = []
    rendered = ""
    for k, message in enumerate(messages):
        if message["role"] == "assistant":
            before = tok.apply_chat_template(messages[:k], tools=[CALC_TOOL], add_generation_prompt=True,
                                             tokenize=False)
            reply = tok.apply_chat_template(messages[:k + 1], tools=[CALC_TOOL], tokenize=False)[len(before):]
            reply = reply[: reply.index("<|im_end|>") + len("<|im_end|>")]
            for text, loss in ((before[len(rendered):], 0), (reply, 1)):
                piece = tok.encode(text, add_special_tokens=False)
                ids, mask = ids + piece, mask + [loss] * len(piece)
            rendered = before + reply
    return ids, mask


def training_rows(tok, settings: dict) -> list[Row]:
    task = ArithmeticTask(ArithOptions(**settings["task"]["kwargs"]), seed=settings["task"]["seed"])
    rng = random.Random(settings["seed"])
    rows = []
    for prompt, completion in task.sft_examples(settings["examples"]):  # never the test split
        answer = completion.removesuffix(TERMINATOR)
        rows.append(encode_transcript(tok, transcript(prompt, answer, rng.random() < settings["tool_rate"])))
    return rows


def make(output: Path, settings: dict, after_stage: tuple[int, str] | None = None) -> Path:
    """Train a new tiny model through every stage into `output`; `after_stage=(k, folder)` goes on
    from stage k's result saved in `folder` (the same model the full run has there)."""
    configure_threads(settings["threads"])
    torch.manual_seed(settings["seed"])
    tok = calc_tokenizer()
    m = settings["model"]
    model = tiny_model(m["arch"], settings["seed"], vocab_size=len(tok), hidden_size=m["hidden_size"],
                       layers=m["layers"], heads=m["heads"], max_positions=m["max_positions"], tokenizer=tok).train()
    if after_stage is not None:
        model = load_policy(after_stage[1])
    rows = training_rows(tok, settings)
    start = time.perf_counter()
    for k, stage in enumerate(settings["stages"]):
        if after_stage is None or k > after_stage[0]:
            fit(model, rows, tok.pad_token_id, random.Random(settings["seed"] + k), steps=stage["steps"],
                lr=stage["lr"], batch_size=settings["batch_size"])
    output.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(output)
    tok.save_pretrained(output)
    header = "# Made by `python scripts/make_calc_tiny.py` (these are its settings).\n"
    (output / "sft_config.yaml").write_text(header + yaml.safe_dump(settings, sort_keys=False))
    print(f"saved {output} in {time.perf_counter() - start:.0f} s")
    return output


def check(folder: str, problems: int, samples: int, temperature: float) -> dict:
    """The example agent on the first `problems` held-out problems (the `arith` test split, which
    training never sees), `samples` runs each, through the endpoint: success and tool-call rate."""
    import asyncio

    import openai

    from cadence.agents import AgentEndpoint
    from cadence.data.arithmetic import ArithmeticTask
    from cadence.inference.embedded import EmbeddedEngine
    from cadence.inference.hub import InferenceHub
    from cadence.models.loading import load_tokenizer

    configure_threads(SETTINGS["threads"])
    run = load_python_object(f"python:{AGENT_FILE}:run", "the demo's agent")
    tok = load_tokenizer(folder)
    hub = InferenceHub([EmbeddedEngine(load_policy(folder).eval(), tok, seed=0)])
    task = ArithmeticTask(ArithOptions(**SETTINGS["task"]["kwargs"]), seed=SETTINGS["task"]["seed"])
    rows = [{"prompt": p.text, "answer": p.answer} for p in task.prompts("test", problems)]

    async def one(endpoint: AgentEndpoint, row: dict) -> dict:
        client = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key="check", max_retries=0)
        try:
            return await run(client, row, temperature=temperature)
        finally:
            await client.close()

    async def main() -> list[dict]:
        endpoint = AgentEndpoint(hub, tok, strict=False)
        await endpoint.start()
        try:
            return await asyncio.gather(*(one(endpoint, row) for row in rows for _ in range(samples)))
        finally:
            await endpoint.stop()

    outcomes = asyncio.run(hub.serving(main()))
    runs = len(outcomes)
    called = [o for o in outcomes if o["tool_calls"]]
    result = {
        "runs": runs, "temperature": temperature,
        "success": sum(o["reward"] for o in outcomes) / runs,
        "tool_call_rate": len(called) / runs,
        "success_with_tool": sum(o["reward"] for o in called) / max(1, len(called)),
        "success_without_tool": sum(o["reward"] for o in outcomes if not o["tool_calls"]) / max(1, runs - len(called)),
    }
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items()))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="runs/sft-calc")
    parser.add_argument("--overwrite", action="store_true", help="replace a folder that already holds files")
    parser.add_argument("--tool-rate", type=float, default=SETTINGS["tool_rate"])
    parser.add_argument("--check", metavar="FOLDER", help="only measure a made model (held-out success, tool calls)")
    parser.add_argument("--problems", type=int, default=100, help="--check: held-out problems")
    parser.add_argument("--samples", type=int, default=4, help="--check: runs per problem")
    parser.add_argument("--temperature", type=float, default=1.0, help="--check: sampling temperature")
    args = parser.parse_args()
    if args.check:
        check(args.check, args.problems, args.samples, args.temperature)
        return
    out = Path(args.output)
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        raise SystemExit(f"--output {out} already holds files; pass --overwrite to replace them")
    make(out, {**SETTINGS, "tool_rate": args.tool_rate})


if __name__ == "__main__":
    main()
