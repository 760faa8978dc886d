"""`cadence rhythm` stops a response where the checkpoint's task ends an answer, unless told otherwise."""

from __future__ import annotations

from typer.testing import CliRunner

from cadence.cli import app
from cadence.recipes.rhythm import default_stop


def test_the_default_stop_is_the_checkpoints_task(tmp_path):
    assert default_stop("builtin") == ["\n"]  # warmed up on arith: answers end at a newline
    assert default_stop("builtin:frozenlake") == []  # episodes: EOS ends a move
    (tmp_path / "run_config.yaml").write_text("task:\n  name: jsonl\n")
    assert default_stop(str(tmp_path)) == []
    (tmp_path / "run_config.yaml").write_text("task:\n  name: chain\n")
    assert default_stop(str(tmp_path)) == ["\n"]
    assert default_stop(str(tmp_path / "nothing-recorded")) == []


def test_the_readme_example_draws_the_answer_not_filler(tmp_path):
    result = CliRunner().invoke(app, ["rhythm", "builtin", "37+45=", "--out", str(tmp_path / "r.png")])
    assert result.exit_code == 0, result.output
    tokens = int(next(x for x in result.output.splitlines() if "response tokens" in x).split()[0])
    assert tokens <= 4, result.output  # "82\n" (or a slipped "72\n"), not 128 tokens
    explicit = CliRunner().invoke(app, ["rhythm", "builtin", "37+45=", "--stop", "X", "--max-new-tokens", "16",
                                        "--out", str(tmp_path / "r.png")])
    assert "16 response tokens" in explicit.output, explicit.output
