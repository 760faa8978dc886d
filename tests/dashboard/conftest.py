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
