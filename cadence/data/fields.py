"""Where a data file's row keeps its prompt and answer: field paths and the presets of common layouts.

A field path is a column name or a dotted path into nested objects
(``reward_model.ground_truth``). A preset names a layout people already have:

* ``verl``: verl's RL parquet. ``prompt`` is a list of chat messages, the answer is
  ``reward_model.ground_truth``; ``data_source`` and ``extra_info`` ride along in `Prompt.meta`.
* ``trl``: TRL's GRPO data. ``prompt`` is text or chat messages, the answer is the first of
  the columns ``answer``, ``ground_truth``, ``solution`` the file has.
* ``messages``: OpenAI-style chat files. ``messages`` is the conversation; its final
  assistant message is the answer (a reference reply) and is not part of the prompt.
  With `task.answer_field` set, that field is the answer and every message is prompt.

``auto`` picks by the columns of the file: ``reward_model`` -> verl, ``messages`` without
``prompt`` -> messages, else trl (which also covers plain ``prompt``/``answer`` rows).
`task.prompt_field` / `task.answer_field` override what a preset says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cadence.data.tasks import Prompt

Preset = Literal["auto", "verl", "trl", "messages"]
ROLES = ("system", "user", "assistant")
TRL_ANSWERS = ("answer", "ground_truth", "solution")
LAST_ASSISTANT = "<the final assistant message>"  # the answer of the messages preset


class DataFileError(ValueError):
    """A data file that cannot be used; the message names the file, the row and the field."""


@dataclass(frozen=True)
class Layout:
    """The field paths of one file: the prompt (text or messages) and the gold answer."""

    preset: str
    prompt: str
    answer: str

    def roots(self, columns: Sequence[str]) -> list[str]:
        """The top-level columns that must hold the prompt and answer: a path that is a column
        name as written, else the first part of the dotted path."""
        paths = [self.prompt] if self.answer == LAST_ASSISTANT else [self.prompt, self.answer]
        return list(dict.fromkeys(p if p in columns else p.split(".")[0] for p in paths))


def resolve_layout(
    preset: Preset, prompt_field: str | None, answer_field: str | None, columns: Sequence[str], where: str
) -> Layout:
    """The layout of a file whose top-level columns are `columns`; `where` names it in errors."""
    if preset == "auto":
        if "reward_model" in columns and "prompt" in columns:
            preset = "verl"
        elif "messages" in columns and "prompt" not in columns:
            preset = "messages"
        else:
            preset = "trl"
    if preset == "verl":
        prompt, answer = "prompt", "reward_model.ground_truth"
    elif preset == "messages":
        prompt, answer = "messages", LAST_ASSISTANT
    else:
        prompt = "prompt"
        answer = next((c for c in TRL_ANSWERS if c in columns), "answer")
    layout = Layout(preset, prompt_field or prompt, answer_field or answer)
    if layout.prompt == layout.answer:
        raise DataFileError(f"{where}: task.prompt_field and task.answer_field are both {layout.prompt!r}")
    missing = [root for root in layout.roots(columns) if root not in columns]
    if missing:
        hint = "task.prompt_field" if layout.prompt.startswith(missing[0]) else "task.answer_field"
        raise DataFileError(
            f"{where}: no column {missing[0]!r} (read as the {layout.preset} layout; columns: "
            f"{', '.join(columns)}); set {hint} to the column that holds it, or task.preset"
        )
    return layout


def field_value(record: dict[str, Any], path: str) -> tuple[bool, Any]:
    """(found, value) of a field path in a row: a key as written, else a dotted path into objects."""
    if path in record:
        return True, record[path]
    value: Any = record
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def check_messages(value: list, where: str, field: str) -> list[dict[str, str]]:
    """Chat messages as `Prompt.messages` wants them (role and content only), or a DataFileError."""
    if not value:
        raise DataFileError(f"{where}: field {field!r} is an empty list of messages")
    messages = []
    for i, message in enumerate(value):
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if role not in ROLES or not isinstance(content, str):
            raise DataFileError(
                f"{where}: field {field!r} message {i} must be {{'role': {'|'.join(ROLES)}, "
                f"'content': <string>}}, got {_short(message)}"
            )
        messages.append({"role": role, "content": content})
    return messages


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def messages_text(messages: list[dict[str, str]]) -> str:
    """The plain-text form of a chat prompt (for logs, splitting, and models without a template)."""
    return "\n\n".join(m["content"] for m in messages)


def read_prompt(record: dict[str, Any], layout: Layout, where: str, prompt_id: str) -> Prompt:
    """One row as a `Prompt`; a DataFileError naming `where` and the field when it does not fit."""
    found, value = field_value(record, layout.prompt)
    if not found:
        raise DataFileError(f"{where}: missing field {layout.prompt!r} (fields present: {sorted(record)})")
    messages = None
    if isinstance(value, list):
        messages = check_messages(value, where, layout.prompt)
        if layout.answer == LAST_ASSISTANT:
            if messages[-1]["role"] != "assistant":
                raise DataFileError(
                    f"{where}: field {layout.prompt!r} does not end with an assistant message, the "
                    "answer in the messages layout; set task.answer_field to the field that holds it"
                )
            answer: Any = messages.pop()["content"]
            if not messages:
                raise DataFileError(f"{where}: field {layout.prompt!r} has no message before the answer")
        text = messages_text(messages)
    elif isinstance(value, str):
        text = value
    else:
        raise DataFileError(
            f"{where}: field {layout.prompt!r} must be a string or a list of chat messages, "
            f"got {type(value).__name__}"
        )
    if not text.strip():
        raise DataFileError(f"{where}: field {layout.prompt!r} is an empty prompt")
    if layout.answer != LAST_ASSISTANT:
        found, answer = field_value(record, layout.answer)
        if not found:
            raise DataFileError(
                f"{where}: missing field {layout.answer!r} (fields present: {sorted(record)})"
            )
    if isinstance(answer, bool) or not isinstance(answer, str | int | float):
        raise DataFileError(
            f"{where}: field {layout.answer!r} must be a string or number, got {type(answer).__name__}"
        )
    answer = str(answer)
    if not answer.strip():
        raise DataFileError(f"{where}: field {layout.answer!r} is an empty answer")
    top = {layout.prompt, layout.answer}
    meta = {k: v for k, v in record.items() if k not in top}
    return Prompt(id=prompt_id, text=text, answer=answer, meta=meta, messages=messages)
