"""`cadence serve`: a local checkpoint behind the agent endpoint, driven by the real openai client."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from tests.chat_models import chat_model, chat_tokenizer
from tests.signals import ctrl_c_reaches_it


@pytest.mark.slow
def test_cadence_serve_answers_a_chat_request_from_the_openai_client(tmp_path):
    tok = chat_tokenizer("qwen2")
    chat_model("qwen2", tok).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    server = subprocess.Popen([sys.executable, "-m", "cadence", "serve", str(tmp_path / "model"), "--port", "0"],
                              stdout=subprocess.PIPE, stderr=(tmp_path / "stderr").open("w"), text=True, env=env,
                              preexec_fn=ctrl_c_reaches_it)
    try:
        line = server.stdout.readline()  # blocks until it serves, or dies ("": its error is in stderr)
        found = re.search(r"at (http://127\.0\.0\.1:\d+/v1)", line)
        assert found, line + (tmp_path / "stderr").read_text()[-3000:]
        client = openai.OpenAI(base_url=found.group(1), api_key="unused", max_retries=0, timeout=120)
        assert [m.id for m in client.models.list().data] == [str(tmp_path / "model")]
        reply = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=8, logprobs=True)
        choice = reply.choices[0]
        assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
        assert 0 < reply.usage.completion_tokens <= 8 and len(choice.logprobs.content) == reply.usage.completion_tokens
        client.close()
    finally:
        server.send_signal(signal.SIGINT)  # Ctrl-C: a clean stop
        try:
            stopped = server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            raise
    assert stopped == 0


def test_cadence_serve_refuses_a_folder_that_is_no_checkpoint(tmp_path):
    from typer.testing import CliRunner

    from cadence.cli import app

    result = CliRunner().invoke(app, ["serve", str(tmp_path)])
    assert result.exit_code == 2 and "cadence serve" in result.output and str(tmp_path) in result.output
