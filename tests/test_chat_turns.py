"""Chat-template turns: tokens in and out through the real hub and embedded engine, and the
whole sequence reads as the template renders the same conversation."""

from __future__ import annotations

import asyncio

import pytest

from cadence.envs.config import EnvConfig
from cadence.envs.runner import EnvRunner
from cadence.inference.embedded import EmbeddedEngine
from cadence.inference.types import SamplingParams
from cadence.models.loading import load_tokenizer
from cadence.rollout.episode import run_episode
from cadence.rollout.turns import ChatTurns, PlainTurns, turn_format
from tests.chat_models import chat_model, chat_tokenizer
from tests.test_episode import Echo, RecordingHub

MARK = "<<assistant {}>>"


def _text(tok, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def test_the_delta_is_what_the_template_writes_between_two_assistant_turns():
    qwen, llama = chat_tokenizer("qwen2"), chat_tokenizer("llama3")
    assert ChatTurns().delta(qwen, "turn 1") == "<|im_end|>\n<|im_start|>user\nturn 1<|im_end|>\n<|im_start|>assistant\n"
    assert ChatTurns("be brief").delta(llama, " turn 1 ") == (
        "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nturn 1<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    # The first turn: the template's own BOS, no second one from the tokenizer.
    first = ChatTurns("be brief").first(llama, "go")
    assert _text(llama, first) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nbe brief<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\ngo<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_the_end_of_turn_token_is_appended_only_when_the_model_did_not_sample_it():
    tok = chat_tokenizer("qwen2")
    eot, a = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("a")
    delta = tok(ChatTurns().delta(tok, "obs"), add_special_tokens=False).input_ids
    assert delta[0] == eot
    assert ChatTurns().after(tok, [a, a, eot], "obs") == delta[1:]  # stopped at its end-of-turn token
    assert ChatTurns().after(tok, [a, a, a], "obs") == delta  # ran out of max_new_tokens


@pytest.mark.parametrize("style", ["qwen2", "llama3"])
def test_a_chat_episode_is_the_last_context_plus_output_and_reads_as_the_template(style):
    tok = chat_tokenizer(style)
    hub = RecordingHub([EmbeddedEngine(chat_model(style, tok, eot_bias=2.0), tok, seed=0)])
    ended_by_model, ended_by_length = check_chat_episodes(tok, hub, play_chat_episodes(hub, tok, episodes=8))
    # Both ways a turn ends were exercised: the model's end-of-turn token, and max_new_tokens.
    # The episodes' turns share one engine, so the order they reach it (the load moves it) picks
    # the samples: 16 turns at this bias ended 4-12 ways by the model in 24 engine seeds; at
    # 2.5 with 8 turns, 3 of 24 seeds ended none by length (a failure seen under load).
    assert ended_by_model > 0 and ended_by_length > 0


def play_chat_episodes(hub: RecordingHub, tok, episodes: int = 4) -> list:
    """`episodes` three-turn Echo episodes at once through `hub`, in the chat template with a
    system prompt, 4 sampled tokens a turn."""
    turns = ChatTurns("be brief")
    params = SamplingParams(max_new_tokens=4, temperature=1.0)

    async def play():
        return await asyncio.gather(*[
            run_episode(hub, EnvRunner(Echo, action_tag=None), tok, params, seed, f"e{seed}", turns=turns)
            for seed in range(episodes)
        ])

    return asyncio.run(hub.serving(play()))


def check_chat_episodes(tok, hub: RecordingHub, played: list) -> tuple[int, int]:
    """Each Echo episode `played[seed]` (system prompt "be brief") is its last turn's context plus
    output, id for id, and reads as the template renders the conversation. Returns how many of
    the first two turns ended with the model's end-of-turn token, and how many ran out of tokens."""
    eot = tok.convert_tokens_to_ids(tok.eos_token)
    ended_by_model = ended_by_length = 0
    for seed, episode in enumerate(played):
        assert episode.ok and episode.turns == 3
        seen = [(req, out) for req, out in hub.seen if req.request_id.startswith(f"e{seed}/")]
        sample = episode.sample
        last_req, last_out = seen[-1]
        # Tokens in, tokens out: id for id.
        assert sample.prompt_ids + sample.response_ids == last_req.prompt_ids + last_out.token_ids
        assert [t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m] == [
            t for _, out in seen for t in out.token_ids
        ]
        # The template's rendering of the same conversation, the model's text put in verbatim.
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"start {seed}"}]
        texts = []
        for k, (_, out) in enumerate(seen):
            closed = out.token_ids[-1] == eot
            ended_by_model += closed and k < 2
            ended_by_length += (not closed) and k < 2
            texts.append(_text(tok, out.token_ids[:-1] if closed and k < 2 else out.token_ids))
            messages.append({"role": "assistant", "content": MARK.format(k)})
            if k < 2:
                messages.append({"role": "user", "content": f"turn {k + 1}"})
        expected = tok.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True) + MARK.format(2)
        for k, text in enumerate(texts):
            expected = expected.replace(MARK.format(k), text)
        assert _text(tok, sample.prompt_ids + sample.response_ids) == expected
    return ended_by_model, ended_by_length


def test_auto_picks_the_chat_template_when_the_tokenizer_has_one():
    chat, plain = chat_tokenizer("qwen2"), load_tokenizer("builtin")
    assert turn_format(EnvConfig(), chat) == ChatTurns()
    assert turn_format(EnvConfig(), plain) == PlainTurns()
    assert turn_format(EnvConfig(turn_format="plain", system_prompt="hi"), chat) == PlainTurns("hi")
    assert turn_format(EnvConfig(system_prompt="hi"), chat) == ChatTurns("hi")
    with pytest.raises(ValueError, match="env.turn_format=chat: the model's tokenizer has no chat template"):
        turn_format(EnvConfig(turn_format="chat"), plain)
