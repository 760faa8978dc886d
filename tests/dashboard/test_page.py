"""The page in headless chromium on planted run folders (no training): markup in any field of a
run folder or a sandbox service's answer is shown as text and never runs, and the charts read
well (titles clear of the mode bar, small numbers without SI prefixes, reward/accuracy visible
over an identical reward/mean, a resumed run's new target)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fastapi import FastAPI

from cadence.dashboard.app import create_app
from cadence.dashboard.sandboxes import SandboxService
from cadence.train.resume import record_changes
from tests.dashboard.conftest import write_agent_run, write_failing_env_run, write_run
from tests.dashboard.serving import serving

pytestmark = pytest.mark.slow  # starts a browser


def payload(field: str) -> str:
    """Markup that, inserted unescaped in text or in a quoted attribute, records `field` in window.__xss
    and leaves an element marked data-xss."""
    return f'\'"><img src=x onerror=window.__xss.push("{field}") data-xss={field}>'


def plant_evil_run(root: Path) -> Path:
    run = root / "evil"
    (run / "events").mkdir(parents=True)
    P = payload
    config = {"trainer": {"steps": P("config-steps")}, "task": {"name": P("config-task")},
              "algorithm": {"name": P("config-algorithm"), "credit": P("config-credit")}, "note": P("config-text")}
    (run / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
    (run / "status.json").write_text(json.dumps({"state": P("status-state"), "error": P("status-error"),
                                                 "traceback": P("status-traceback"), "step": P("status-step")}))
    rows = [{"step": 1, "reward/mean": 0.5, P("metric-key"): 1.0, "eval/success" + P("metric-key-drawn"): 0.5},
            {"step": 2, "reward/mean": P("metric-value"), "train/kl": P("metric-kl")},
            {"step": P("metric-step"), "reward/mean": P("metric-last-value")}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sample = {"step": 1, "group_id": 0, "index": 0, "trainer_version": P("sample-trainer-version"),
              "prompt": P("sample-prompt"), "group_rewards": [P("sample-group-reward"), 1.0],
              "reward": P("sample-reward"), "version": P("sample-version"), "finish_version": P("sample-finish-version"),
              "staleness": P("sample-staleness"), "finish_reason": P("sample-finish-reason"),
              "reward_error": P("sample-reward-error"), "tokens": [P("sample-token"), P("sample-env-token")],
              "loss_mask": [1, 0], "logprobs": [P("sample-logprob"), P("sample-env-logprob")],
              "turn_rewards": [[0, P("sample-turn-reward")]]}
    (run / "samples.jsonl").write_text(json.dumps(sample) + "\n")
    span = {"actor": "trainer", "state": P("event-state"), "t0": 1.0, "t1": 2.0, "step": P("event-step")}
    (run / "events" / "trainer.jsonl").write_text(json.dumps(span) + "\n" + json.dumps(
        {"kind": "staleness", "step": 1, "alpha": P("event-alpha"), "counts": {"0": 1}}) + "\n")
    (run / "events" / (P("event-actor") + ".jsonl")).write_text(json.dumps({**span, "state": "generating"}) + "\n")
    (run / "summary.json").write_text(json.dumps({"eval_after": {"pass_at_1": P("summary-pass")}, "x": P("summary")}))
    (run / "checkpoints" / P("checkpoint-name")).mkdir(parents=True)
    (run / "reward_errors.log").write_text(P("reward-errors"))
    (run / "env_errors.log").write_text(P("env-errors"))
    (run / "resume_changes.yaml").write_text(json.dumps([{"changes": {"trainer.steps": {"to": P("resume-steps")}},
                                                          "note": P("resume-text")}]))
    named = root / P("run-name")
    named.mkdir()
    (named / "config.yaml").write_text("trainer: {steps: 3}\n")
    return run


def evil_sandbox_service() -> FastAPI:
    """A sandbox service's two endpoints, every field holding markup."""
    P, now = payload, time.time()
    app = FastAPI()
    box = {"id": P("box-id"), "state": P("box-state"), "generation": P("box-generation"), "created_at": now,
           "last_used": now, "execs": P("box-execs"), "replacements": P("box-replacements"),
           "cpu_s": P("box-cpu"), "memory_mb": P("box-memory"), "last_reason": P("box-reason"),
           "limits": {"cpu_s": P("box-limit-cpu"), "memory_mb": P("box-limit-memory"), "processes": P("box-limit-procs")}}
    event = {"id": 1, "ts": now, "sandbox_id": P("event-box"), "generation": P("event-generation"), "state": "dead",
             "reason": P("event-reason")}

    @app.get("/v1/status")
    def status() -> dict:
        return {"counts": {P("count-key"): P("count-value")}, "sandboxes": [box]}

    @app.get("/v1/events")
    def events(since_id: int = 0) -> list:
        return [event] if since_id == 0 else []

    return app


NOTHING_RAN = "() => window.__xss.length === 0 && document.querySelectorAll('[data-xss]').length === 0"


def assert_nothing_ran(page, where: str) -> None:
    page.wait_for_timeout(300)  # an <img onerror> fires once its load fails
    ran = page.evaluate("() => [...window.__xss, ...[...document.querySelectorAll('[data-xss]')].map((e) => e.dataset.xss)]")
    assert ran == [], f"{where}: markup from these fields ran: {sorted(set(ran))}"


def test_markup_in_every_field_is_shown_as_text(browser, shots, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    plant_evil_run(root)
    with serving(evil_sandbox_service()) as sandbox_url:
        service = SandboxService(sandbox_url, "token")
        with serving(create_app(root, [service], poll_s=0.3)) as url:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.add_init_script("window.__xss = []")
            page.goto(url + "/")
            page.wait_for_function("() => document.querySelectorAll('#runs-table tbody tr').length === 2")
            assert_nothing_ran(page, "runs list")
            assert 'onerror=window.__xss.push("run-name")' in page.inner_text("#runs-table")  # shown, as text
            page.click('tr[data-run="evil"]')
            page.wait_for_selector("#chart-reward .main-svg")
            assert_nothing_ran(page, "charts")
            assert "status-error" in page.inner_text("#run-error-text")
            page.click('#tabs button[data-tab="config"]')
            page.wait_for_selector("#details .card")
            assert_nothing_ran(page, "config")
            assert 'push("reward-errors")' in page.inner_text("#details")
            assert 'push("env-errors")' in page.inner_text("#lost-episodes")
            page.click('#tabs button[data-tab="samples"]')
            page.click("#groups .item >> nth=0")
            page.wait_for_selector("#group .sample .tok.loss")
            assert_nothing_ran(page, "samples")
            assert 'push("sample-version")' in page.inner_text("#group .sample .meta")
            page.click('#tabs button[data-tab="pipeline"]')
            page.wait_for_function("() => document.getElementById('timeline')?.data?.length >= 2")
            assert_nothing_ran(page, "pipeline")
            legend = page.eval_on_selector("#timeline .legend", "e => e.textContent")
            assert 'push("event-state")' in legend  # plotly shows the escaped text as it was written
            shots(page, "xss-pipeline")
            page.goto(url + "/#/sandboxes")
            page.wait_for_selector("#sandbox-view tr[data-sandbox]")
            assert_nothing_ran(page, "sandboxes")
            assert 'push("box-reason")' in page.inner_text("#sandbox-view")
            shots(page, "xss-sandboxes")
            page.close()
        service.close()


def test_charts_read_well(browser, shots, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    run = write_run(root, "resumed", steps=3)
    record_changes(run, 3, {"trainer.steps": {"from": 3, "to": 60}})
    with (run / "metrics.jsonl").open("a") as f:  # binary rewards: accuracy == mean; a tiny KL
        for step in range(4, 9):
            f.write(json.dumps({"step": step, "reward/mean": step / 10, "reward/accuracy": step / 10,
                                "train/kl": step * 1e-13}) + "\n")
    with serving(create_app(root, poll_s=0.3)) as url:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(url + "/#/run/resumed")
        page.wait_for_selector("#chart-kl .ytick text")
        assert page.inner_text('tr[data-run="resumed"] td:nth-child(3)') == "8/60"  # the target --resume set
        ticks = page.eval_on_selector_all("#chart-kl .ytick text", "els => els.map((e) => e.textContent)")
        for tick in ticks:  # "4e−13", never "400f"
            float(tick.replace("\u2212", "-"))
        traces = page.evaluate("() => document.getElementById('chart-reward').data.map((t) => [t.name, t.line?.dash])")
        dashes = dict(traces)
        assert {"reward/mean", "reward/accuracy"} <= set(dashes)
        assert dashes["reward/accuracy"] not in (None, "solid") and dashes["reward/mean"] in (None, "solid")
        for chart in page.query_selector_all("#charts > div"):
            chart.hover()  # the mode bar shows while the pointer is over the chart
            title, bar = (chart.query_selector(sel).bounding_box() for sel in (".gtitle", ".modebar"))
            apart = (title["x"] + title["width"] <= bar["x"] or bar["x"] + bar["width"] <= title["x"]
                     or title["y"] + title["height"] <= bar["y"] or bar["y"] + bar["height"] <= title["y"])
            assert apart, f"{chart.get_attribute('id')}: the mode bar covers the title ({title} vs {bar})"
        shots(page, "charts-read-well")
        page.close()


def offpolicy_row(step: int, buckets: dict[str, float]) -> dict:
    """A training row of an asynchronous run: the offpolicy/* metrics, grad norms for `buckets`."""
    row = {"step": step, "reward/mean": 0.5, "offpolicy/ess": 0.9 - step / 100, "offpolicy/ess_seq": 0.6,
           "offpolicy/masked_frac": 0.01 * step, "offpolicy/truncated_frac": 0.002, "offpolicy/kl_mu_pi_old": 0.1 * step}
    return row | {f"offpolicy/grad_norm_stale_{b}": v for b, v in buckets.items()}


def test_offpolicy_metrics_are_a_chart_group_when_a_run_has_them(browser, shots, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    write_run(root, "sync", steps=3)
    run = write_run(root, "async", steps=3, finish=False)
    with (run / "metrics.jsonl").open("a") as f:  # the first steps: every sample fresh, no grad norm per bucket
        f.write(json.dumps(offpolicy_row(4, {})) + "\n")
    charts = "() => [...document.querySelectorAll('#charts > *')].map((e) => e.id || 'heading: ' + e.textContent)"
    traces = "(id) => document.getElementById(id)?.data?.map((t) => t.name) ?? []"
    with serving(create_app(root, poll_s=0.3)) as url:
        page = browser.new_page(viewport={"width": 1400, "height": 1400})
        page.goto(url + "/#/run/sync")
        page.wait_for_selector("#chart-reward .main-svg")
        assert not any("offpolicy" in c or "heading" in c for c in page.evaluate(charts))  # none: nothing to show

        page.goto(url + "/#/run/async")
        page.wait_for_selector("#chart-offpolicy-kl .main-svg")
        shown = page.evaluate(charts)
        group = shown.index("heading: off-policy (samples behind the trainer's policy)")
        assert shown[group + 1:] == ["chart-offpolicy-ess", "chart-offpolicy-masked", "chart-offpolicy-kl"]
        assert page.evaluate(traces, "chart-offpolicy-ess") == ["offpolicy/ess", "offpolicy/ess_seq"]
        assert page.evaluate(traces, "chart-offpolicy-masked") == ["offpolicy/masked_frac", "offpolicy/truncated_frac"]
        assert page.evaluate("() => document.getElementById('chart-offpolicy-ess').layout.yaxis.range") == [0, 1.05]

        with (run / "metrics.jsonl").open("a") as f:  # stale samples arrive: their buckets' grad norms, live
            f.write(json.dumps(offpolicy_row(5, {"0": 0.4, "1": 0.3})) + "\n")
            f.write(json.dumps(offpolicy_row(6, {"0": 0.5, "1": 0.2, "2-3": 0.1})) + "\n")
        page.wait_for_function(f"() => ({traces})('chart-offpolicy-grad').length === 3", timeout=30_000)
        assert page.evaluate(charts)[-1] == "chart-offpolicy-grad"
        assert page.evaluate(traces, "chart-offpolicy-grad") == [
            "offpolicy/grad_norm_stale_0", "offpolicy/grad_norm_stale_1", "offpolicy/grad_norm_stale_2-3"]
        assert page.evaluate("() => document.getElementById('chart-offpolicy-kl').data[0].x") == [4, 5, 6]
        shots(page, "offpolicy-charts")
        page.close()


def test_agent_tool_calls_and_lost_episodes_show(browser, shots, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    write_agent_run(root, "agent")
    write_failing_env_run(root, "broken-env")
    with serving(create_app(root, poll_s=0.3)) as url:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(url + "/#/run/agent")
        page.click('#tabs button[data-tab="samples"]')
        page.click("#groups .item >> nth=0")
        page.wait_for_selector("#group .sample .turn.call")
        episode = page.locator("#group .sample >> nth=0")
        assert [t.get_attribute("class") for t in episode.locator(".turn").all()] == [
            "turn model", "turn call", "turn tool", "turn model"]
        assert episode.locator(".turn.call .call-name").inner_text() == "calc"
        assert '"<i>6*7</i>"' in episode.locator(".turn.call .call-args").inner_text()  # markup shown as text
        assert episode.locator(".turn.call i").count() == 0
        assert episode.locator(".turn.call .tok.loss").count() > 0  # the call's tokens carried loss
        assert "tool result" in episode.locator(".turn.tool").inner_text()
        assert "42" in episode.locator(".turn.tool").inner_text() and episode.locator(".turn.tool .tok.loss").count() == 0
        shots(page, "agent-tool-call")
        page.goto(url + "/#/run/broken-env")
        page.wait_for_selector("#run-lost:not([hidden])")
        assert page.inner_text("#run-lost").startswith("lost episodes: raised 9, timeout 1")
        page.click('#tabs button[data-tab="config"]')
        page.wait_for_selector("#lost-episodes")
        lost = page.inner_text("#lost-episodes")
        assert "raised: 9" in lost and "timeout: 1" in lost
        assert "raised during step" in lost and "ValueError: <b>no move</b>" in lost  # escaped, shown as text
        assert page.locator("#lost-episodes pre b").count() == 0
        shots(page, "lost-episodes")
        page.close()


def test_the_canary_pass_rate_is_a_chart_when_a_run_has_it(browser, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    run = write_run(root, "agent", steps=3, finish=False)
    with (run / "metrics.jsonl").open("a") as f:  # agent.canaries: the measured hack rate
        f.write(json.dumps({"step": 4, "reward/mean": 0.5, "agent/canary_pass_rate": 0.25}) + "\n")
    with serving(create_app(root, poll_s=0.3)) as url:
        page = browser.new_page(viewport={"width": 1400, "height": 1400})
        page.goto(url + "/#/run/agent")
        page.wait_for_selector("#chart-canaries .main-svg")
        assert page.evaluate("() => document.getElementById('chart-canaries').data.map((t) => t.name)") == [
            "agent/canary_pass_rate"]
        assert page.evaluate("() => document.getElementById('chart-canaries').layout.yaxis.range") == [0, 1.05]
        page.close()
