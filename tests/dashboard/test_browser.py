"""The dashboard in a real headless browser (Debian's chromium driven by playwright): a run
appears and its chart grows while it trains, a failed run shows its error, a sample opens
token by token, and a killed sandbox's restart shows up. Screenshots go to the folder printed
at the start (pytest's temporary folder, or $CADENCE_TEST_ARTIFACTS); the `browser` and `shots`
fixtures are in conftest.py."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from cadence.dashboard.app import create_app
from cadence.dashboard.sandboxes import SandboxService
from cadence.sandbox.client import Sandbox
from tests.dashboard.serving import serving
from tests.quick_run import QUICK_RUN
from tests.sandbox.service import running_service
from tests.test_agentic_train import QUICK_AGENT

pytestmark = pytest.mark.slow
# Generous: a loaded 2-core machine takes tens of seconds to import torch and load a model.
WAIT_MS = 150_000
POINTS = "(id, name) => { const d = document.getElementById(id); const t = d && d.data && d.data.find((t) => t.name === name); return t ? t.x.length : 0; }"


def start_run(root: Path, name: str, *overrides: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "cadence", "train", *QUICK_RUN, "checkpoint.every=0", f"logging.name={name}",
           f"logging.run_dir={root}/{{name}}", *overrides]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_live_run_failed_run_and_samples(browser, shots, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    root.mkdir()
    bad_reward = tmp_path / "bad_reward.py"
    bad_reward.write_text("def score(prompt, response):\n    raise KeyError('answer')\n")
    # Both at once: their start-up (imports, model load) overlaps.
    live = start_run(root, "live", "trainer.steps=40")
    bad = start_run(root, "bad", "trainer.steps=20", f"reward.name=python:{bad_reward}:score")
    try:
        with serving(create_app(root, poll_s=0.5)) as url:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(url + "/")
            page.wait_for_selector('tr[data-run="live"]', timeout=WAIT_MS)  # the run appears, no reload
            shots(page, "1-run-listed")
            page.click('tr[data-run="live"]')
            page.wait_for_function(f"() => ({POINTS})('chart-reward', 'reward/mean') >= 1", timeout=WAIT_MS)
            first = page.evaluate(f"({POINTS})('chart-reward', 'reward/mean')")
            page.wait_for_function(f"() => ({POINTS})('chart-reward', 'reward/mean') > {first}", timeout=WAIT_MS)
            assert live.poll() is None or first < 40  # it grew while the run trained
            shots(page, "2-chart-growing")

            page.wait_for_selector('tr[data-run="bad"]', timeout=WAIT_MS)
            page.click('tr[data-run="bad"]')
            page.wait_for_selector("#run-error:not([hidden])", timeout=WAIT_MS)
            assert "RewardFunctionError" in page.inner_text("#run-error-text")
            assert page.inner_text("#run-state") == "failed"
            shots(page, "3-failed-run")

            page.click('tr[data-run="live"]')
            page.click('#tabs button[data-tab="samples"]')
            page.click("#groups .item >> nth=0", timeout=30_000)
            page.wait_for_selector("#group .sample .tok.loss", timeout=30_000)  # tokens that carried loss
            assert "reward" in page.inner_text("#group .sample .meta")
            shots(page, "4-samples")
            page.click('#tabs button[data-tab="pipeline"]')
            page.wait_for_selector("#timeline .main-svg", timeout=30_000)
            page.wait_for_function("() => document.getElementById('timeline').data.length >= 2", timeout=30_000)
            shots(page, "5-pipeline")
            page.close()  # ends its event stream before the server stops
    finally:
        for proc in (live, bad):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()


def test_agentic_episode_opens_turn_by_turn(browser, shots, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    root.mkdir()
    agentic = start_run(root, "agentic", *QUICK_AGENT[len(QUICK_RUN):], "algorithm.credit=coupled",
                        "algorithm.rhythm.fai_min=2")
    assert agentic.wait(timeout=WAIT_MS / 1000) == 0
    with serving(create_app(root, poll_s=0.5)) as url:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(url + "/#/run/agentic")
        page.click('#tabs button[data-tab="samples"]')
        page.click("#groups .item >> nth=0", timeout=30_000)
        page.wait_for_selector("#group .sample .turn.env", timeout=30_000)
        episode = page.locator("#group .sample >> nth=0")
        # model turn, the environment's observation, model turn: only the model's tokens carry loss
        assert [t.get_attribute("class") for t in episode.locator(".turn").all()] == [
            "turn model", "turn env", "turn model"]
        assert episode.locator(".turn.env .tok").count() >= 1 and episode.locator(".turn.env .tok.loss").count() == 0
        assert episode.locator(".turn.model .tok.loss").count() >= 2
        assert "again" in episode.locator(".turn.env").inner_text()  # what Parity answered
        assert "reward" in episode.locator(".meta").inner_text()
        shots(page, "8-agentic-episode")
        episode.locator(".rhythm-btn").click()  # the WAAD / FAI picture of this episode
        page.wait_for_function("() => document.querySelector('#group .rhythm-plot')?.data?.length === 3",
                               timeout=WAIT_MS)
        assert episode.locator(".rhythm-tokens .tok").count() == episode.locator(".turn.model .tok, .turn.env .tok").count()
        assert episode.locator(".rhythm-tokens .tok.credited").count() >= 1
        shots(page, "9-agentic-rhythm")
        page.close()


def test_killed_sandbox_restart_shows(browser, shots, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    with running_service(str(tmp_path), "--warm", "1", "--health-period-s", "0.3") as (service_url, token, proc):
        service = SandboxService(service_url, token)
        with Sandbox(url=service_url, token=token) as box, serving(create_app(runs, [service], poll_s=0.5)) as url:
            info = box.status()
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(url + "/#/sandboxes")
            row = f'tr[data-sandbox="{info.id}"]'
            page.wait_for_selector(row, timeout=30_000)
            assert page.inner_text(f"{row} .restarts") == "0"
            shots(page, "6-sandboxes")
            pid = getattr(info, "pid", None)
            agents = [psutil.Process(pid)] if pid else [c for c in psutil.Process(proc.pid).children(recursive=True)
                                                         if "cadence-sandbox-agent" in " ".join(c.cmdline())]
            for agent in agents:
                agent.kill()
            page.wait_for_function(f"() => document.querySelector('{row} .restarts')?.textContent === '1'",
                                   timeout=30_000)
            assert "dead" in page.inner_text(".card .fail")  # the failure, with its reason
            shots(page, "7-sandbox-restarted")
            page.close()
        service.close()
