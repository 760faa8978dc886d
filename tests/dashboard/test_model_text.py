"""What the dashboard shows of the model's own text (issue 33, findings 16 and 17): a logged sample
whose tool call nests past the recursion limit is shown as text (the samples view was a 500), a crafted line in
env_errors.log is parsed in linear time (a 110 KB line held the GIL for about 8 s), and the model's
text in a failure's message or traceback is clipped where the error logs are written."""

from __future__ import annotations

import threading
from pathlib import Path

from cadence.dashboard.episodes import ALL_FORMATS, lost_episodes, with_tool_calls
from cadence.envs.runner import EnvFailure
from cadence.observe.reward_errors import describe_failure
from cadence.rollout.failures import Failures

NESTED_CALL = '<tool_call>{"name": "add", "arguments": ' + "[" * 5_000 + "]" * 5_000 + "}</tool_call>"


def test_a_sample_with_a_deeply_nested_tool_call_is_shown_as_text():
    tokens = [NESTED_CALL[i:i + 1000] for i in range(0, len(NESTED_CALL), 1000)]
    turn = {"role": "model", "tokens": tokens, "logprobs": [-0.1] * len(tokens), "reward": 1.0}
    assert with_tool_calls([turn], ALL_FORMATS) == [turn]


def test_a_crafted_env_errors_line_is_parsed_in_linear_time(tmp_path: Path):
    """The old pattern's two lazy `.*?` rescanned the line from every `: an episode (seed `; this
    200 KB line took it minutes. Parsed in a thread that must end well within a generous bound, so a
    quadratic parser fails here instead of holding the test for minutes."""
    honest = "environment e: an episode (seed 3) was lost: raised during step: boom\nTraceback ...\n\n"
    crafted = "environment " + ": an episode (seed " * 10_000 + "\n"
    (tmp_path / "env_errors.log").write_text(honest + crafted + honest.replace("seed 3", "seed 4"))
    found: list = []
    worker = threading.Thread(target=lambda: found.append(lost_episodes(tmp_path, {})), daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert found, "env_errors.log took over 20 s to parse"
    reports = found[0]["reports"]
    assert [r["kind"] for r in reports] == ["raised during step", "raised during step"]
    assert reports[0]["text"].endswith(crafted.strip()) and "(seed 4)" in reports[1]["text"]


def test_model_text_is_clipped_where_failures_are_logged(tmp_path: Path):
    log = tmp_path / "env_errors.log"
    failure = EnvFailure("raised", "step", "ValueError: " + "m" * 1_000_000, traceback="Traceback\n" + "t" * 1_000_000)
    Failures("e", log=log, echo=False).record_lost(failure, 3)
    assert log.stat().st_size < 25_000
    [report] = lost_episodes(tmp_path, {})["reports"]
    assert report["kind"] == "raised during step" and "characters cut" in report["text"]
    text = describe_failure("ValueError", {"message": "m" * 1_000_000, "traceback": "t" * 1_000_000,
                                           "prompt": "p", "response": "r"}, 1)
    assert len(text) < 25_000 and "characters cut" in text
