"""Prompts into the token ids the engine sees: through the model's chat template, or raw text.

With a chat template (`task.chat_template=on`, or `auto` and the tokenizer has one) a
prompt's ids are exactly

    tokenizer.apply_chat_template(messages, add_generation_prompt=True, **task.chat_template_kwargs)

where `messages` are the prompt's own chat messages when its row gave them, else its text as
one user turn; `task.system_prompt` comes first as a system message unless the messages bring
their own. An instruct model answers after its assistant header and closes its turn with the
template's end-of-turn token (`<|im_end|>`, `<|eot_id|>`), which is not always the tokenizer's
EOS (a Qwen2.5 base tokenizer's EOS is `<|endoftext|>`): that token ends a response too.

Without one (the built-in models) the ids are `tokenizer(text).input_ids`, as they always were,
after the system prompt's own line when there is one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from cadence.data.config import TaskConfig
from cadence.data.tasks import Prompt


def has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


@dataclass
class PromptRenderer:
    """A prompt's token ids (see the module docstring); `chat=False` is raw text."""

    tokenizer: PreTrainedTokenizerBase
    chat: bool = False
    system_prompt: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    _cache: dict[str, list[int]] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def for_task(cls, task: TaskConfig, tokenizer: PreTrainedTokenizerBase, model: str) -> PromptRenderer:
        """The renderer `task.chat_template` asks for, for the tokenizer of `model` (its
        `model.path`, named in the error when `on` finds no template)."""
        if task.chat_template == "on" and not has_chat_template(tokenizer):
            raise ValueError(
                f"task.chat_template=on: model {model!r} has no chat template (none in its tokenizer "
                "files); use task.chat_template=auto or off, or a checkpoint whose tokenizer has one"
            )
        chat = task.chat_template == "on" or (task.chat_template == "auto" and has_chat_template(tokenizer))
        return cls(tokenizer, chat, task.system_prompt, dict(task.chat_template_kwargs))

    def messages(self, prompt: Prompt) -> list[dict[str, Any]]:
        """The chat messages a prompt renders as: its own, or its text as one user turn."""
        messages = prompt.messages if prompt.messages is not None else [{"role": "user", "content": prompt.text}]
        if self.system_prompt and not (messages and messages[0].get("role") == "system"):
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        return messages

    def ids(self, prompt: Prompt) -> list[int]:
        """The prompt's token ids, computed once per distinct prompt (a prompt recurs every
        epoch and in every group)."""
        key = prompt.text if prompt.messages is None else json.dumps(prompt.messages, sort_keys=True)
        ids = self._cache.get(key)
        if ids is None:
            ids = self._cache[key] = self._render(prompt)
        return ids

    def _render(self, prompt: Prompt) -> list[int]:
        if not self.chat:
            head = f"{self.system_prompt}\n" if self.system_prompt else ""
            return self.tokenizer(head + prompt.text).input_ids
        return list(self.tokenizer.apply_chat_template(
            self.messages(prompt), add_generation_prompt=True, tokenize=True, return_dict=False,
            **self.template_kwargs,
        ))

    def stop_token_ids(self) -> list[int]:
        """The template's end-of-turn token, when it is a special token (a response that writes
        it is over); none for raw text, whose responses end at EOS or the task's stop strings."""
        if not self.chat:
            return []
        from cadence.rollout.turns import ChatTurns, is_special

        try:
            after_turn = ChatTurns().delta(self.tokenizer, "next")
        except (ValueError, TemplateError):  # a template that rewrites the assistant's text: EOS only
            return []
        ids = self.tokenizer(after_turn, add_special_tokens=False).input_ids
        return [ids[0]] if ids and is_special(self.tokenizer, ids[0]) else []
