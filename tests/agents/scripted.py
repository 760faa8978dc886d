"""Test helpers: chat templates with tools (Qwen 2.5 and Llama 3.1 styles) and a scripted engine.

The scripted engine answers each request with the tokenizer's ids of a reply a
function chooses from the prompt text, plus the end-of-turn token, and keeps
everything it sampled, so a test can check the trained ids against it.
"""

from __future__ import annotations

from collections.abc import Callable

from cadence.inference.types import GenRequest, GenResult, InFlight, run_to_completion
from tests.chat_models import chat_tokenizer

QWEN_TOOLS_TEMPLATE = (
    "{%- if tools -%}"
    "{{ '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content + '\\n\\n' }}"
    "{%- else %}{{ 'You are a helpful assistant.\\n\\n' }}{% endif -%}"
    "{{ '# Tools\\n\\n<tools>' }}{% for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role != 'system' -%}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' -%}"
    "{%- if not tools %}{{ '<|im_start|>system\\n' + message.content + '<|im_end|>\\n' }}{% endif -%}"
    "{%- elif message.role == 'assistant' -%}"
    "{{ '<|im_start|>assistant\\n' + message.content }}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set f = call.function -%}"
    "{%- if message.content or not loop.first %}{{ '\\n' }}{% endif -%}"
    "{{ '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' + (f.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' -%}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

LLAMA_TOOLS_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if tools -%}"
    "{{ '<|start_header_id|>system<|end_header_id|>\\n\\nTo call a function, reply with JSON "
    "{\"name\": function name, \"parameters\": its arguments}.' }}"
    "{% for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}{{ '<|eot_id|>' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'assistant' and message.tool_calls -%}"
    "{%- set f = message.tool_calls[0].function -%}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n{\"name\": \"' + f.name + '\", \"parameters\": '"
    " + (f.arguments | tojson) + '}<|eot_id|>' }}"
    "{%- elif message.role == 'tool' -%}"
    "{{ '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' }}"
    "{%- else -%}"
    "{{ '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif -%}"
)

TOOL_TEMPLATES = {"qwen2": QWEN_TOOLS_TEMPLATE, "llama3": LLAMA_TOOLS_TEMPLATE}


def tool_tokenizer(style: str):
    """The tests' chat tokenizer of `style` with a template that renders tools and tool calls."""
    tok = chat_tokenizer(style)
    tok.chat_template = TOOL_TEMPLATES[style]
    return tok


class ScriptedEngine:
    """An engine whose replies are `reply(prompt_text)`, encoded, plus EOS; keeps what it sampled."""

    def __init__(self, tok, reply: Callable[[str], str]) -> None:
        self.tok = tok
        self.reply = reply
        self.version = 0
        self.sampled: list[GenResult] = []
        self._waiting: list[GenRequest] = []

    def add_request(self, req: GenRequest) -> None:
        self._waiting.append(req)

    def step(self) -> list[GenResult]:
        done, self._waiting = self._waiting, []
        results = []
        for req in done:
            text = self.reply(self.tok.decode(req.prompt_ids))
            ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
            seq = InFlight(req, self.version, ids, [-0.01 * (len(self.sampled) + i + 1) for i in range(len(ids))])
            result = seq.result("stop", text, self.version)
            self.sampled.append(result)
            results.append(result)
        return results

    def has_unfinished(self) -> bool:
        return bool(self._waiting)

    def generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        return run_to_completion(self, reqs)[0]

    def abort(self, request_id: str) -> GenResult | None:
        return None

    def update_weights(self, state_dict, version: int) -> None:
        self.version = version

    def load(self) -> int:
        return len(self._waiting)

    def sampling_state(self) -> dict:
        return {}

    def load_sampling_state(self, state: dict) -> None:
        pass

    def stats(self) -> dict:
        return {"sampled": len(self.sampled)}
