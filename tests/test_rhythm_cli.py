"""`cadence rhythm`: the attention-rhythm PNG for one response, from a prompt or a rollout file."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cadence.cli import app
from cadence.models.tiny import char_tokenizer
from cadence.observe.rhythm_plot import token_label
from cadence.recipes.rhythm import rollout_record
from tests.tiny_models import save_tiny

runner = CliRunner()
SUMMARY = re.compile(
    r"^(\d+) response tokens, credit (local|global|coupled): ([\d.]+)% amplified, "
    r"mean gamma ([\d.]+)$",
    re.M,
)


@pytest.fixture(scope="module")
def tiny6(tmp_path_factory) -> str:
    return save_tiny(str(tmp_path_factory.mktemp("tiny6")), layers=6, hidden_size=64)


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG, checking its signature and IHDR chunk."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    assert data.rstrip(b"\x00")[-8:-4] == b"IEND"
    return struct.unpack(">II", data[16:24])


def _check_png(path: Path) -> None:
    assert path.is_file()
    width, height = _png_size(path)
    assert 600 <= width <= 5000 and 500 <= height <= 2000, (width, height)
    assert 10_000 < path.stat().st_size < 5_000_000


def _summary(output: str) -> re.Match:
    match = SUMMARY.search(output)
    assert match, output
    return match


def test_prompt_writes_png_and_summary(tiny6, tmp_path):
    png = tmp_path / "plots" / "r.png"  # missing folder is created
    result = runner.invoke(
        app,
        [
            "rhythm",
            tiny6,
            "12+7=",
            "--max-new-tokens",
            "24",
            "--temperature",
            "0",
            "--out",
            str(png),
            "window=5",
            "top_q=0.3",
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"wrote {png}" in result.output
    match = _summary(result.output)
    assert 1 <= int(match.group(1)) <= 24 and match.group(2) == "coupled"
    assert 1.0 <= float(match.group(4)) <= 2.0
    _check_png(png)


def test_rollout_file_ids_and_text(tiny6, tmp_path):
    tok = char_tokenizer()
    prompt_ids = tok("Q: 3*4+5=?").input_ids
    response_ids = tok("3*4 is 12, plus 5 is 17. Answer: 17", add_special_tokens=False).input_ids
    rollout = tmp_path / "rollout.jsonl"
    rollout.write_text(
        json.dumps({"prompt": "1+1=", "response": "2, since one and one make two.\n"})
        + "\n\n"
        + json.dumps(rollout_record(prompt_ids, response_ids, reward=1.0))
        + "\n"
    )
    png = tmp_path / "ids.png"
    result = runner.invoke(
        app,
        [
            "rhythm",
            tiny6,
            "--from-rollout",
            str(rollout),
            "--index",
            "1",
            "--credit",
            "local",
            "--out",
            str(png),
            "gamma_amp=2",
        ],
    )
    assert result.exit_code == 0, result.output
    match = _summary(result.output)
    assert int(match.group(1)) == len(response_ids) and match.group(2) == "local"
    # local credit picks ceil(0.4 R) tokens with a positive Delta, each at gamma_amp = 2
    assert 0 < float(match.group(3)) <= 100 * 0.4 + 3
    _check_png(png)

    png_text = tmp_path / "text.png"
    result = runner.invoke(
        app,
        [
            "rhythm",
            tiny6,
            "--from-rollout",
            str(rollout),
            "--credit",
            "global",
            "-o",
            str(png_text),
        ],
    )
    assert result.exit_code == 0, result.output
    assert int(_summary(result.output).group(1)) == len("2, since one and one make two.\n")
    _check_png(png_text)


def test_two_layer_model(tiny_llama_dir, tmp_path):
    png = tmp_path / "two.png"
    result = runner.invoke(
        app,
        [
            "rhythm",
            tiny_llama_dir,
            "hi",
            "--max-new-tokens",
            "16",
            "--temperature",
            "1",
            "--out",
            str(png),
        ],
    )
    assert result.exit_code == 0, result.output
    _summary(result.output)
    _check_png(png)


def test_bad_checkpoint_is_a_clear_error(tmp_path):
    missing = tmp_path / "no-such-model"
    result = runner.invoke(app, ["rhythm", str(missing), "hello", "--out", str(tmp_path / "x.png")])
    assert result.exit_code == 2
    assert str(missing) in result.output
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["hello", "windw=5"], "did you mean 'window'"),
        (["hello", "top_q=2"], "top_q"),
        (["hello", "--credit", "none"], "--credit"),
        ([], "PROMPT or --from-rollout"),
    ],
)
def test_bad_arguments(tiny6, tmp_path, args, message):
    result = runner.invoke(app, ["rhythm", tiny6, *args, "--out", str(tmp_path / "x.png")])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_bad_rollout_record(tiny6, tmp_path):
    rollout = tmp_path / "bad.jsonl"
    rollout.write_text(json.dumps({"text": "hello"}) + "\n")
    result = runner.invoke(app, ["rhythm", tiny6, "--from-rollout", str(rollout)])
    assert result.exit_code == 2
    assert "prompt_ids and response_ids" in result.output and str(rollout) in result.output
    result = runner.invoke(app, ["rhythm", tiny6, "--from-rollout", str(rollout), "--index", "3"])
    assert result.exit_code == 2 and "1 record" in result.output


def test_rollout_record_loss_mask(tiny6, tmp_path, monkeypatch):
    """An episode's observation tokens (loss_mask 0) get no credit; a bad mask is named."""
    prompt_ids, response_ids = list(range(20, 28)), list(range(30, 60))
    mask = [1] * 10 + [0] * 10 + [1] * 10
    rollout = tmp_path / "episode.jsonl"
    rollout.write_text(
        json.dumps(rollout_record(prompt_ids, response_ids, loss_mask=mask))
        + "\n"
        + json.dumps(rollout_record(prompt_ids, response_ids, loss_mask=[1, 0]))
        + "\n"
    )
    args = ["rhythm", tiny6, "--from-rollout", str(rollout), "--credit", "global", "fai_min=2"]
    result = runner.invoke(app, [*args, "-o", str(tmp_path / "ep.png")])
    assert result.exit_code == 0, result.output
    # ceil(0.4 * 20 model tokens) = 8 anchors of 30 response tokens: 26.7% amplified
    assert _summary(result.output).group(3) == "26.7"
    # A bad record is named before the policy loads (the slow part on a real checkpoint).
    import cadence.models.loading

    def no_load(*_args, **_kwargs):
        raise AssertionError("the policy loaded before the record was checked")

    monkeypatch.setattr(cadence.models.loading, "load_policy", no_load)
    result = runner.invoke(app, [*args, "--index", "1", "-o", str(tmp_path / "bad.png")])
    assert result.exit_code == 2 and "loss_mask must be a list of 30 zeros and ones" in result.output


def test_token_labels_are_visible():
    assert token_label("\n") == "\\n"
    assert token_label(" a") == "\u2423a"
    assert token_label(" ") == "\u2423"
    assert token_label("$x$") == "$x$"
    assert len(token_label("a" * 40)) == 12
