"""The dashboard's HTTP API and its server-sent events, over run folders the runtime's writers made."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from cadence.dashboard.app import create_app, plotly_js
from tests.dashboard.conftest import (
    AGENT_ANSWER,
    AGENT_RESULT,
    write_agent_run,
    write_failing_env_run,
    write_run,
)
from tests.dashboard.serving import local_client, serving, sse_events


def test_runs_details_metrics_timeline_and_samples(runs_root: Path) -> None:
    failed = write_run(runs_root, "broken", steps=2, finish=False)
    from cadence.observe.run_status import RunStatus

    try:
        raise RuntimeError("rollout worker 0 failed:\nKeyError: 'answer'")
    except RuntimeError as err:
        RunStatus(failed).failed(err)
    client = local_client(create_app(runs_root))
    runs = {r["name"]: r for r in client.get("/api/runs").json()}
    assert runs["broken"]["state"] == "failed" and runs["broken"]["error"] == "RuntimeError: KeyError: 'answer'"
    details = client.get("/api/runs/broken").json()
    assert "KeyError" in details["status"]["traceback"] and "steps: 2" in details["config"]
    series = client.get("/api/runs/done/metrics", params={"keys": "reward/mean,train/loss"}).json()["series"]
    assert series["reward/mean"] == {"x": [1, 2, 3, 4, 5], "y": [0.2, 0.4, 0.6, 0.8, 1.0]}
    assert list(client.get("/api/runs/done/metrics", params={"match": "^(reward|perf)/"}).json()["series"]) == [
        "perf/samples_per_s", "reward/mean"]
    assert client.get("/api/runs/done/metrics", params={"match": "(("}).status_code == 400
    timeline = client.get("/api/runs/done/timeline").json()
    assert timeline["staleness"] == {"0": 15, "1": 5} and len(timeline["spans"]["trainer"]) == 5
    groups = client.get("/api/runs/done/samples").json()
    assert groups[0]["step"] == 5
    samples = client.get(f"/api/runs/done/samples/5/{groups[0]['group_id']}").json()
    assert samples[0]["turns"][0]["tokens"] == ["4", "2"]
    assert client.get("/api/runs/done/samples/99/99").status_code == 404
    assert client.get("/api/runs/nope").status_code == 404
    assert client.get("/api/sandboxes").json() == []


def test_page_and_plotly_come_from_local_files(runs_root: Path) -> None:
    client = local_client(create_app(runs_root))
    page = client.get("/").text
    assert 'src="/static/plotly.min.js"' in page and "://" not in page  # nothing from the network
    js = client.get("/static/plotly.min.js")
    assert js.status_code == 200 and len(js.content) == plotly_js().stat().st_size
    assert client.get("/static/app.js").status_code == 200
    assert client.get("/static/..%2Fapp.py").status_code == 404


def test_token_is_required_when_given(runs_root: Path) -> None:
    client = local_client(create_app(runs_root, token="s3cret"))
    assert client.get("/api/runs").status_code == 401
    assert client.get("/api/runs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/", params={"token": "s3cret"}).status_code == 200  # sets the cookie
    assert client.get("/api/runs").status_code == 200  # the cookie from the page is enough now
    assert local_client(create_app(runs_root, token="s3cret")).get(
        "/api/runs", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_stream_pushes_new_metric_rows(runs_root: Path) -> None:
    with serving(create_app(runs_root, poll_s=0.1)) as url:
        with httpx.stream("GET", f"{url}/api/stream", params={"run": "done", "rows": 3}, timeout=20) as response:
            events = sse_events(response)
            seen = {}
            for event, data in events:
                seen[event] = json.loads(data)
                if {"runs", "rows", "timeline", "samples"} <= set(seen):
                    break
            assert [r["step"] for r in seen["rows"]["rows"]] == [4, 5]  # only the rows past the client's 3
            with (runs_root / "done" / "metrics.jsonl").open("a") as f:
                f.write(json.dumps({"step": 6, "reward/mean": 1.0, "note": "text"}) + "\n")
            for event, data in events:
                if event == "rows":
                    assert json.loads(data)["rows"] == [{"step": 6, "reward/mean": 1.0}]  # numbers only
                    break


@pytest.mark.slow  # starts the dashboard subprocess, as `cadence train logging.dashboard=true` does
def test_dashboard_beside_a_run_serves_and_stops(runs_root: Path, capsys) -> None:
    from cadence.config import load_config
    from cadence.dashboard.beside import start_beside

    cfg = load_config(None, ["logging.dashboard=true", "logging.dashboard_port=0", "logging.name=done",
                             f"logging.run_dir={runs_root}/{{name}}"])
    beside = start_beside(cfg.logging.dashboard_port, cfg.run_dir())
    try:
        assert beside.url in capsys.readouterr().out and beside.url.endswith("/#/run/done")
        deadline = time.monotonic() + 60
        while True:
            try:
                runs = httpx.get(beside.url.split("#")[0] + "api/runs", timeout=2).json()
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and beside.proc.poll() is None
                time.sleep(0.2)
        assert [r["name"] for r in runs] == ["done"]
    finally:
        beside.stop()
    assert beside.proc.poll() is not None


def test_rhythm_of_an_episode_sample(runs_root: Path) -> None:
    """WAAD, FAI and gamma per token of one logged episode, with the run's model; observation
    tokens (loss mask 0) get no credit, and a run without rhythm credit says so."""
    from cadence.observe.sample_log import SampleLog
    from cadence.rollout.sample import Group, Sample
    from tests.dashboard.conftest import CharTokenizer

    run = runs_root / "rhythm"
    run.mkdir()
    (run / "config.yaml").write_text("model:\n  path: builtin\nalgorithm:\n  name: grpo\n  credit: coupled\n"
                                     "  rhythm:\n    fai_min: 2\n")
    model, observation = "x = 3 + 4, so x is 7 and 7 + 1 is 8", "\ntry again\n"
    response = [ord(c) for c in model + observation + model]
    mask = [1] * len(model) + [0] * len(observation) + [1] * len(model)
    sample = Sample(prompt_id="p", group_id=0, prompt_ids=[ord(c) for c in "What is 3 + 4 + 1?"],
                    response_ids=response, behaviour_logprobs=[-0.5] * len(response), reward=1.0, version=0,
                    finish_reason="stop", loss_mask=mask)
    log = SampleLog(run, CharTokenizer(), every=1)
    log.log(1, 0, [Group(group_id=0, prompt_id="p", samples=[sample])])
    log.close()
    client = local_client(create_app(runs_root))
    got = client.get("/api/runs/rhythm/rhythm/1/0/0").json()
    assert got["credit"] == "coupled" and got["checkpoint"] == "builtin"
    assert len(got["waad"]) == len(got["fai"]) == len(got["gamma"]) == len(response)
    assert max(got["fai"]) > 0 and max(got["waad"]) > 0
    observed = [i for i, m in enumerate(mask) if not m]
    assert all(got["gamma"][i] == 1.0 and not got["credited"][i] for i in observed)
    assert any(got["credited"])  # some of the model's tokens got more (or less) than the plain advantage
    assert client.get("/api/runs/rhythm/rhythm/1/0/5").status_code == 404
    assert "credit=none" in client.get("/api/runs/done/rhythm/5/5/0").json()["detail"]


def test_agent_episode_shows_tool_call_and_result_as_turns(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    write_agent_run(root, "agent")
    client = local_client(create_app(root))
    [episode] = client.get("/api/runs/agent/samples/1/0").json()
    turns = episode["turns"]
    assert [t["role"] for t in turns] == ["model", "call", "tool", "model"]
    assert "".join(turns[0]["tokens"]) == "Let me compute."
    assert (turns[1]["name"], json.loads(turns[1]["arguments"])) == ("calc", {"expr": "<i>6*7</i>"})
    assert "".join(turns[1]["tokens"]).startswith("<tool_call>")
    assert "".join(turns[2]["tokens"]) == AGENT_RESULT and "".join(turns[3]["tokens"]) == AGENT_ANSWER
    assert sum(len(t["tokens"]) for t in turns) == len(episode["tokens"])  # every token in one turn


def test_failed_episodes_are_listed_with_their_error(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    write_failing_env_run(root, "broken-env")
    lost = local_client(create_app(root)).get("/api/runs/broken-env").json()["lost_episodes"]
    assert lost["lost"] == {"raised": 9, "timeout": 1}
    assert [r["kind"] for r in lost["reports"]] == ["raised during step", "timeout during reset"]
    assert "(seed 0)" in lost["reports"][0]["text"] and 'line 9, in step' in lost["reports"][0]["text"]
    assert "reset took longer than 5 s" in lost["reports"][1]["text"]
    write_run(root, "fine", steps=1)
    assert local_client(create_app(root)).get("/api/runs/fine").json()["lost_episodes"] is None


def test_lost_agent_runs_are_listed_with_their_error(tmp_path: Path) -> None:
    from cadence.observe.metrics import MetricsLogger
    from cadence.rollout.failures import AGENT_RUNS, Failures, RunFailure

    run = tmp_path / "runs" / "broken-agent"
    write_agent_run(tmp_path / "runs", "broken-agent")
    report = Failures("python:my_agents:run", AGENT_RUNS, run / "env_errors.log", echo=False)
    report.record_lost(RunFailure("raised", "run: KeyError: 'answer'", traceback="Traceback ...\nKeyError: 'answer'\n"),
                       "eval 3")
    MetricsLogger(run, {}, tensorboard=False).log(2, {"agent/runs_lost_total": 5.0})
    client = local_client(create_app(tmp_path / "runs"))
    lost = client.get("/api/runs/broken-agent").json()["lost_episodes"]
    assert lost["lost"] == {"agent runs": 5}
    assert [r["kind"] for r in lost["reports"]] == ["raised during run"]
    assert "(task eval 3)" in lost["reports"][0]["text"] and "KeyError: 'answer'" in lost["reports"][0]["text"]
    assert client.get("/api/runs/broken-agent/samples").json()[0]["turns"] == 4  # text, call, result, answer
