"""Turn formats: how an episode's observations become token ids around the model's own tokens.

Tokens in, tokens out: the ids the engine sampled are kept as they are and
a format only ever produces the ids that go *between* them, so the trained
sequence is the last turn's context plus its output, id for id, and the
model's decoded text is never tokenised again.

    first(tokenizer, obs0)                       -> the prompt ids (the context of turn 0)
    after(tokenizer, output_ids, obs_k)          -> the ids appended after turn k-1's output

`PlainTurns` (models without a chat template, the built-in one) puts each
observation between newlines. `ChatTurns` renders the tokenizer's chat
template (Qwen2, Llama 3, ...): the observations are user messages and the
model's turns assistant messages. Its `after` ids are the template's *delta*:
whatever the template writes after an assistant message's content up to the
next assistant header (the end-of-turn tokens, the user header, the
observation, the assistant header). The delta is found by rendering
[system?, user, assistant=MARK, user=obs_k] with the generation prompt and
taking the text after MARK, so it does not depend on the model's own text;
it is tokenised once, by itself. When the model closed its turn itself (its
last sampled id is the special token the delta starts with, e.g.
`<|im_end|>` or `<|eot_id|>`), that token is not appended a second time;
when it did not (it ran out of `max_new_tokens`), the delta supplies it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from transformers import PreTrainedTokenizerBase

from cadence.envs.config import EnvConfig

# Stands in for the assistant's content while the template is rendered: the delta is what follows it.
ASSISTANT_MARK = "\x00cadence-assistant-turn\x00"
# Stands in for the previous observation, so the delta is that of a later user turn.
EARLIER_OBSERVATION = "(earlier observation)"


class TurnFormat(Protocol):
    """How observations become ids around the model's turns (see the module docstring)."""

    def first(self, tokenizer: PreTrainedTokenizerBase, observation: str) -> list[int]: ...

    def after(self, tokenizer: PreTrainedTokenizerBase, output_ids: list[int], observation: str) -> list[int]: ...


@dataclass(frozen=True)
class PlainTurns:
    """Plain text for models without a chat template (the built-in model):
    `[system_prompt\\n]<observation>\\n` first, then `\\n<observation>\\n` after every model turn."""

    system_prompt: str | None = None

    def first(self, tokenizer: PreTrainedTokenizerBase, observation: str) -> list[int]:
        head = f"{self.system_prompt}\n" if self.system_prompt else ""
        return tokenizer(f"{head}{observation}\n").input_ids

    def after(self, tokenizer: PreTrainedTokenizerBase, output_ids: list[int], observation: str) -> list[int]:
        return tokenizer(f"\n{observation}\n", add_special_tokens=False).input_ids


@dataclass(frozen=True)
class ChatTurns:
    """The tokenizer's chat template: observations are user messages, the model's turns
    assistant messages, `system_prompt` (if any) a system message."""

    system_prompt: str | None = None

    def _messages(self, *turns: tuple[str, str]) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + [{"role": role, "content": content} for role, content in turns]

    def first(self, tokenizer: PreTrainedTokenizerBase, observation: str) -> list[int]:
        text = tokenizer.apply_chat_template(
            self._messages(("user", observation)), tokenize=False, add_generation_prompt=True
        )
        # The template writes its own BOS where the model wants one.
        return tokenizer(text, add_special_tokens=False).input_ids

    def delta(self, tokenizer: PreTrainedTokenizerBase, observation: str) -> str:
        """The template's text after an assistant message's content, up to the next assistant header."""
        messages = self._messages(("user", EARLIER_OBSERVATION), ("assistant", ASSISTANT_MARK), ("user", observation))
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if text.count(ASSISTANT_MARK) != 1:
            raise ValueError("the chat template does not write an assistant message's content as it is")
        return text[text.index(ASSISTANT_MARK) + len(ASSISTANT_MARK) :]

    def after(self, tokenizer: PreTrainedTokenizerBase, output_ids: list[int], observation: str) -> list[int]:
        ids = tokenizer(self.delta(tokenizer, observation), add_special_tokens=False).input_ids
        if output_ids and ids and output_ids[-1] == ids[0] and is_special(tokenizer, ids[0]):
            return ids[1:]  # the model sampled the end-of-turn token itself
        return ids


def is_special(tokenizer: PreTrainedTokenizerBase, token_id: int) -> bool:
    """A special token (end-of-turn, header): never part of the model's text. A sampled
    newline that happens to match the template's is text, and stays in the output."""
    added = tokenizer.added_tokens_decoder.get(token_id)
    return token_id in tokenizer.all_special_ids or (added is not None and added.special)


def turn_format(cfg: EnvConfig, tokenizer: PreTrainedTokenizerBase) -> TurnFormat:
    """The format `env.turn_format` names; 'auto' is chat when the tokenizer has a template."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if cfg.turn_format == "chat" and not has_template:
        raise ValueError(
            "env.turn_format=chat: the model's tokenizer has no chat template; use env.turn_format=plain "
            "(or auto), or a checkpoint whose tokenizer_config.json has one"
        )
    if cfg.turn_format == "chat" or (cfg.turn_format == "auto" and has_template):
        return ChatTurns(cfg.system_prompt)
    return PlainTurns(cfg.system_prompt)
