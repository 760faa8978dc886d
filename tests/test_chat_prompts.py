"""RLVR prompts through the model's chat template: the ids the engine sees are the template's,
id for id, and the template's end-of-turn token ends a response."""

from __future__ import annotations

import re

import pytest

from cadence.config import ConfigError, load_config
from cadence.data.config import TaskConfig
from cadence.data.tasks import Prompt
from cadence.inference.embedded import EmbeddedEngine
from cadence.inference.types import GenRequest, SamplingParams
from cadence.models.loading import load_tokenizer
from cadence.rollout.render import PromptRenderer
from tests.chat_models import chat_model, chat_tokenizer, save_chat_model
from tests.quick_run import QUICK_RUN

# Qwen3's way of switching thinking off: an empty think block after the assistant header.
THINKING_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif -%}"
    "{%- endif -%}"
)

PROBLEM = Prompt(id="p", text="37+45=", answer="82")
CHAT = Prompt(id="c", text="be brief\n37+45=", answer="82",
              messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "37+45="}])


def _renderer(tok, model: str = "m", **task) -> PromptRenderer:
    return PromptRenderer.for_task(TaskConfig(**task), tok, model)


def _text(tok, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


@pytest.mark.parametrize(("style", "expected"), [
    ("qwen2", "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
              "<|im_start|>user\n37+45=<|im_end|>\n<|im_start|>assistant\n"),
    ("llama3", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n37+45=<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n"),
])
def test_a_text_prompt_is_the_templates_ids_for_one_user_turn(style, expected):
    tok = chat_tokenizer(style)
    ids = _renderer(tok).ids(PROBLEM)
    messages = [{"role": "user", "content": "37+45="}]
    assert ids == tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ids == tok(expected, add_special_tokens=False).input_ids  # one BOS (the template's), markers as single ids
    assert _text(tok, ids) == expected


@pytest.mark.parametrize("style", ["qwen2", "llama3"])
def test_messages_and_a_system_prompt_render_the_same_way(style):
    tok = chat_tokenizer(style)
    from_messages = _renderer(tok, system_prompt="ignored: the row has its own").ids(CHAT)
    from_text = _renderer(tok, system_prompt="be brief").ids(PROBLEM)
    assert from_messages == from_text == tok.apply_chat_template(CHAT.messages, add_generation_prompt=True,
                                                                 tokenize=True, return_dict=False)
    assert "be brief" in _text(tok, from_text)


def test_chat_template_kwargs_reach_the_template():
    tok = chat_tokenizer("qwen2")
    tok.chat_template = THINKING_TEMPLATE
    thinking, plain = _renderer(tok).ids(PROBLEM), _renderer(tok, chat_template_kwargs={"enable_thinking": False}).ids(PROBLEM)
    assert _text(tok, plain) == _text(tok, thinking) + "<think>\n\n</think>\n\n"


def test_without_a_template_auto_and_off_are_the_raw_text_and_on_names_the_model():
    builtin = load_tokenizer("builtin")  # no chat template
    for mode in ("auto", "off"):
        render = _renderer(builtin, chat_template=mode)
        assert render.ids(PROBLEM) == builtin("37+45=").input_ids and render.stop_token_ids() == []
    assert _renderer(builtin, system_prompt="be brief").ids(PROBLEM) == builtin("be brief\n37+45=").input_ids
    with pytest.raises(ValueError, match="task.chat_template=on: model 'builtin' has no chat template"):
        _renderer(builtin, "builtin", chat_template="on")
    # off on a chat model: its raw text (the messages' plain form when the row gave messages).
    qwen = chat_tokenizer("qwen2")
    assert _renderer(qwen, chat_template="off").ids(CHAT) == qwen("be brief\n37+45=").input_ids


@pytest.mark.parametrize(("style", "end"), [("qwen2", "<|im_end|>"), ("llama3", "<|eot_id|>")])
def test_the_end_of_turn_token_is_the_one_the_template_closes_a_reply_with(style, end):
    tok = chat_tokenizer(style)
    tok.eos_token = "</s>"  # a base tokenizer's EOS: not what the template ends a turn with
    assert _renderer(tok).stop_token_ids() == [tok.convert_tokens_to_ids(end)]


def test_the_end_of_turn_token_ends_a_response_when_it_is_not_the_eos():
    tok = chat_tokenizer("qwen2")
    model = chat_model("qwen2", tok, eot_bias=2.5)  # ends many turns with <|im_end|>
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    tok.eos_token = "</s>"
    model.generation_config.eos_token_id = tok.eos_token_id
    engine = EmbeddedEngine(model, tok, seed=0)
    prompt = _renderer(tok).ids(PROBLEM)

    def sample(**params) -> list:
        requests = [GenRequest(f"r{i}", prompt, SamplingParams(max_new_tokens=8, **params)) for i in range(16)]
        return engine.generate(requests)

    without = sample()
    assert all(r.finish_reason == "length" for r in without)  # <|im_end|> alone ends nothing here
    assert any(eot in r.token_ids[:-1] for r in without)
    ended = [r for r in sample(stop_token_ids=[eot]) if r.finish_reason == "stop"]
    assert ended and all(r.token_ids[-1] == eot and eot not in r.token_ids[:-1] for r in ended)
    assert all(r.text == tok.decode(r.token_ids[:-1], skip_special_tokens=True) for r in ended)


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory) -> str:
    """A saved tiny Qwen2 model whose tokenizer has the Qwen2-style chat template."""
    return save_chat_model(tmp_path_factory.mktemp("tiny_chat"))


def test_chat_template_on_without_one_is_a_config_error_naming_the_model():
    with pytest.raises(ConfigError, match="task.chat_template=on: model 'builtin' has no chat template"):
        load_config(None, ["task.chat_template=on"])


@pytest.mark.slow
def test_training_and_evaluation_send_the_engine_the_templates_ids(chat_model_dir, tmp_path, monkeypatch):
    from cadence.recipes.evaluate import run_eval
    from cadence.recipes.train_rlvr import train

    seen: list[list[int]] = []
    add_request = EmbeddedEngine.add_request

    def recording(engine, req):
        seen.append(list(req.prompt_ids))
        return add_request(engine, req)

    monkeypatch.setattr(EmbeddedEngine, "add_request", recording)
    cfg = load_config(None, [*QUICK_RUN, f"model.path={chat_model_dir}", "trainer.steps=2", "eval.after=true",
                             "rollout.max_new_tokens=4", f"logging.run_dir={tmp_path}/run"])
    train(cfg)
    trained = len(seen)
    run_eval(cfg)  # `cadence eval`
    tok = load_tokenizer(chat_model_dir)
    header = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    for ids in seen:
        problem = re.fullmatch(re.escape(header) + r"(\d+[-+]\d+=)<\|im_end\|>\n<\|im_start\|>assistant\n",
                               _text(tok, ids))
        assert problem, _text(tok, ids)
        messages = [{"role": "user", "content": problem.group(1)}]
        assert ids == tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    # 2 steps x 4 prompts x 4 answers, then the 8 held-out prompts after training and in `cadence eval`.
    assert trained >= 2 * 4 * 4 + 8 and len(seen) == trained + 8


def test_the_shipped_chat_model_answers_through_its_template():
    tok = load_tokenizer("builtin:arith-chat")
    render = _renderer(tok, "builtin:arith-chat", chat_template="on")
    assert _text(tok, render.ids(PROBLEM)) == "<|user|>37+45=<|end|><|assistant|>"
    assert render.stop_token_ids() == [tok.eos_token_id] == [tok.convert_tokens_to_ids("<|end|>")]
