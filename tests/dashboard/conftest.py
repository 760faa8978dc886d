"""Run folders written by the runtime's own writers (metrics, status, timeline, sample log)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cadence.observe.events import Timeline
from cadence.observe.metrics import MetricsLogger
from cadence.observe.run_status import RunStatus
from cadence.observe.sample_log import SampleLog
from cadence.rollout.sample import Group, Sample


class CharTokenizer:
    """Token id = character code: enough to decode what the sample log writes."""

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


def group(step: int, gid: int, rewards: list[float], version: int, mask: list[int] | None = None) -> Group:
    response = [ord(c) for c in "ab\nc"] if mask else [ord(c) for c in "42"]
    samples = [Sample(prompt_id=f"p{gid}", group_id=gid, prompt_ids=[ord(c) for c in "1+1="], response_ids=response,
                      behaviour_logprobs=[-0.5] * len(response), reward=r, version=version, finish_reason="stop",
                      loss_mask=mask, token_rewards=[0.0, r / 2, 0.0, r / 2] if mask else None) for r in rewards]
    return Group(group_id=gid, prompt_id=f"p{gid}", samples=samples)


def write_run(root: Path, name: str, steps: int, finish: bool = True, mask: list[int] | None = None) -> Path:
    run = root / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(f"trainer:\n  steps: {steps}\ntask:\n  name: arith\nalgorithm:\n  name: grpo\n")
    status = RunStatus(run)
    status.start()
    logger = MetricsLogger(run, {}, tensorboard=False)
    timeline = Timeline(run, "trainer", flush_s=0.0)
    samples = SampleLog(run, CharTokenizer(), every=1)
    for step in range(1, steps + 1):
        timeline.enter("training", step)
        timeline.record(kind="staleness", step=step, alpha=1, counts={"0": 3, "1": 1})
        samples.log(step, step - 1, [group(step, step, [1.0, 0.0], max(0, step - 2), mask)])
        logger.log(step, {"reward/mean": step / steps, "train/loss": 1.0 / step, "perf/samples_per_s": 10.0})
        status.beat(step)
    timeline.close()
    samples.close()
    logger.close()
    if finish:
        status.finish()
    return run


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


# An agent episode as the endpoint's recorder sees it: the model's reply calls a tool, the agent
# inserts the tool's result (loss mask 0) and asks again, the model answers.
AGENT_PROMPT = "<user>What is 6*7?</user><assistant>"
AGENT_CALL = 'Let me compute.<tool_call>{"name": "calc", "arguments": {"expr": "<i>6*7</i>"}}</tool_call><end>'
AGENT_RESULT = "<tool>42</tool><assistant>"
AGENT_ANSWER = "It is 42.<end>"


def write_agent_run(root: Path, name: str) -> Path:
    """A finished agent run whose sample log holds one episode with a tool call, recorded by the
    agents' own Trajectory and written by the SampleLog."""
    from cadence.agents.trajectory import Trajectory
    from cadence.inference.types import GenResult

    run = root / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("trainer:\n  steps: 1\nagent:\n  name: python:my_agents:run\n"
                                     "  endpoint:\n    tool_format: hermes\n")
    trajectory = Trajectory("run-1")
    for prompt, reply in ((AGENT_PROMPT, AGENT_CALL), (AGENT_PROMPT + AGENT_CALL + AGENT_RESULT, AGENT_ANSWER)):
        result = GenResult("r", ids(prompt), ids(reply), [-0.25] * len(reply), "stop", reply, 0, 0)
        trajectory.record(ids(prompt), [result], None)
    samples = trajectory.samples(1.0, group_id=0, prompt_id="task-0")
    log = SampleLog(run, CharTokenizer(), every=1)
    log.log(1, 0, [Group(0, "task-0", samples)])
    log.close()
    MetricsLogger(run, {}, tensorboard=False).log(1, {"reward/mean": 1.0})
    return run


def write_failing_env_run(root: Path, name: str) -> Path:
    """A run whose environment raised in step (env_errors.log written by the producer's Failures) and
    stopped: 9 episodes lost."""
    from cadence.envs.runner import EnvFailure
    from cadence.rollout.failures import Failures

    run = root / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("trainer:\n  steps: 4\nenv:\n  name: python:games:Broken\n")
    report = Failures("python:games:Broken", log=run / "env_errors.log", echo=False)
    tb = 'Traceback (most recent call last):\n  File "games.py", line 9, in step\nValueError: <b>no move</b>\n'
    for seed in range(9):
        report.record_lost(EnvFailure("raised", "step", "step: ValueError: <b>no move</b>", traceback=tb), seed)
    report.record_lost(EnvFailure("timeout", "reset", "reset took longer than 5 s"), 9)
    MetricsLogger(run, {}, tensorboard=False).log(1, {"rollout/episodes_lost_raised_total": 9.0,
                                                      "rollout/episodes_lost_timeout_total": 1.0})
    return run


@pytest.fixture
def runs_root(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    write_run(root, "done", steps=5)
    return root


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium, driven by playwright (no browser download)."""
    from playwright.sync_api import sync_playwright

    from cadence.dashboard.screenshot import CHROMIUM, CHROMIUM_ARGS

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    """shots(page, name): a full-page screenshot into $CADENCE_TEST_ARTIFACTS or a temporary folder."""
    folder = Path(os.environ.get("CADENCE_TEST_ARTIFACTS") or tmp_path_factory.mktemp("dashboard-screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\ndashboard screenshots: {folder}")
    return lambda page, name: page.screenshot(path=str(folder / f"{name}.png"), full_page=True)
