"""The dashboard against hostile or broken input: foreign Host headers (DNS rebinding), slow or
huge `?match=` patterns, and run folders whose files are malformed in every way we could think of."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from cadence.dashboard.app import create_app
from cadence.dashboard.matching import MAX_PATTERN
from cadence.http_guards import allowed_names, host_allowed
from cadence.train.resume import record_changes
from tests.dashboard.conftest import write_run
from tests.dashboard.serving import local_client, serving, sse_events


# -- Host header -------------------------------------------------------------------------
def test_only_this_servers_names_are_answered(runs_root: Path) -> None:
    app = create_app(runs_root)
    for name in ("127.0.0.1:8484", "localhost:8484", "[::1]:8484"):
        assert local_client(app).get("/api/runs", headers={"host": name}).status_code == 200, name
    for name in ("evil.example:8484", "evil.example", "127.0.0.1:9999", "localhost.evil.example:8484", "127.0.0.1:x"):
        got = local_client(app).get("/api/runs", headers={"host": name})
        assert got.status_code == 421 and "--allow-host" in got.json()["detail"], name
    assert TestClient(app).get("/").status_code == 421  # TestClient's own name, testserver
    # With a token too: a foreign name is refused before the token is looked at.
    assert local_client(create_app(runs_root, token="s")).get(
        "/api/runs", headers={"host": "evil.example:8484"}).status_code == 421


def test_names_when_bound_elsewhere() -> None:
    names = allowed_names("0.0.0.0", ["dash.example"])
    assert {"127.0.0.1", "localhost", "::1", "0.0.0.0", "dash.example"} <= names
    assert host_allowed("dash.example:8484", names, 8484) and not host_allowed("evil.example:8484", names, 8484)
    assert "dash.example" not in allowed_names("127.0.0.1")
    assert host_allowed("anything:1", allowed_names("127.0.0.1", ["*"]), 8484)
    assert not host_allowed(None, allowed_names("127.0.0.1"), 8484)


def test_rebinding_request_over_the_network_is_refused(runs_root: Path) -> None:
    with serving(create_app(runs_root)) as url:
        port = url.rsplit(":", 1)[1]
        assert httpx.get(f"{url}/api/runs").status_code == 200
        assert httpx.get(f"{url}/api/runs", headers={"Host": f"rebind.evil.example:{port}"}).status_code == 421


# -- ?match= -----------------------------------------------------------------------------
def test_a_slow_pattern_is_cut_and_does_not_hold_up_other_requests(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    run = write_run(root, "r", steps=2)
    with (run / "metrics.jsonl").open("a") as f:  # a key that makes (a|a)+$ backtrack 2^26 ways
        f.write(json.dumps({"step": 3, "a" * 26 + "b": 1.0}) + "\n")
    with serving(create_app(root, match_timeout_s=2.0)) as url:
        slow: dict[str, httpx.Response] = {}
        thread = threading.Thread(target=lambda: slow.setdefault(
            "r", httpx.get(f"{url}/api/runs/r/metrics", params={"match": "(a|a)+$"}, timeout=300)))
        thread.start()
        time.sleep(0.5)  # let the search start (were it to block the server, the requests below would wait)
        for _ in range(3):
            assert httpx.get(f"{url}/api/runs", timeout=60).status_code == 200
            assert thread.is_alive(), "the slow search ended first: other requests waited for it"
        thread.join()
    assert slow["r"].status_code == 400 and "took more than 2 s" in slow["r"].json()["detail"]


def test_a_huge_pattern_is_refused(runs_root: Path) -> None:
    client = local_client(create_app(runs_root))
    got = client.get("/api/runs/done/metrics", params={"match": "a" * (MAX_PATTERN + 1)})
    assert got.status_code == 400 and f"more than {MAX_PATTERN}" in got.json()["detail"]
    assert client.get("/api/runs/done/metrics", params={"match": "reward"}).json()["series"].keys() == {"reward/mean"}


# -- malformed run folders -----------------------------------------------------------------
BAD_FILES = {  # run name -> {file: content}; each run also has a good config.yaml unless it replaces it
    "status-not-json": {"status.json": "{not json"},
    "status-a-list": {"status.json": "[1, 2]"},
    "status-heartbeat-text": {"status.json": json.dumps({"state": "running", "host": "elsewhere", "heartbeat": "soon"})},
    "status-not-utf8": {"status.json": b"\xff\xfe{\x00"},
    "config-not-yaml": {"config.yaml": "trainer: [unclosed\n"},
    "config-a-list": {"config.yaml": "- a\n- b\n"},
    "config-wrong-types": {"config.yaml": "trainer: [1]\ntask: 5\nenv: {name: [x]}\nalgorithm: 3\n"},
    "metrics-junk": {"metrics.jsonl": b'[1]\n5\n"x"\n{"step": "x"}\n{"reward/mean": 1}\n\xff\xff\n{"step": 2, "reward/mean": NaN}\n'},
    "summary-a-list": {"summary.json": "[1]"},
    "samples-junk": {"samples.jsonl": '[1]\n{"step": 1}\n{"step": 1, "group_id": 0, "index": 0, "prompt": "p", '
                                      '"group_rewards": [1], "tokens": ["a"], "loss_mask": [1, 0]}\n'},
    "events-junk": {"events/trainer.jsonl": '[1]\n{"state": "training"}\n{"state": "x", "t0": "a", "t1": 1}\n'
                                            '{"kind": "staleness", "counts": {"x": 1}, "alpha": "a"}\n'
                                            '{"kind": "staleness", "counts": [1]}\n'},
}


def plant(root: Path, files: dict[str, str | bytes]) -> None:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())


def test_a_malformed_run_folder_is_that_runs_error(runs_root: Path) -> None:
    for name, files in BAD_FILES.items():
        run = runs_root / name
        plant(run, {"config.yaml": "trainer:\n  steps: 3\n", **files})
    (runs_root / "metrics-a-folder" / "metrics.jsonl").mkdir(parents=True)
    client = local_client(create_app(runs_root))
    got = client.get("/api/runs")
    assert got.status_code == 200
    runs = {r["name"]: r for r in got.json()}
    assert set(runs) == {"done", "metrics-a-folder", *BAD_FILES}
    assert runs["done"]["state"] == "finished" and runs["done"]["error"] is None and runs["done"]["step"] == 5
    for name in ("status-not-json", "status-a-list", "status-not-utf8"):
        assert runs[name]["state"] == "unreadable" and runs[name]["error"].startswith("status.json: not a JSON object")
    assert runs["status-heartbeat-text"]["error"].startswith("status.json: ValueError")
    assert runs["config-not-yaml"]["error"].startswith("config.yaml: not valid YAML")
    assert runs["config-a-list"]["error"].startswith("config.yaml: not a mapping")
    assert runs["config-wrong-types"]["steps"] is None and runs["config-wrong-types"]["task"] == "['x']"
    assert runs["metrics-junk"]["step"] == 2 and runs["metrics-junk"]["reward"] is None  # NaN: no reward
    for name in runs:
        assert client.get(f"/api/runs/{name}").status_code == 200, name
        for part in ("metrics", "timeline", "samples"):
            assert client.get(f"/api/runs/{name}/{part}").status_code == 200, (name, part)
    details = client.get("/api/runs/config-not-yaml").json()
    assert details["status"]["error"].startswith("config.yaml: not valid YAML")
    assert client.get("/api/runs/metrics-junk/metrics").json()["series"] == {"reward/mean": {"x": [], "y": []}}
    assert client.get("/api/runs/samples-junk/samples").json() == []
    assert client.get("/api/runs/events-junk/timeline").json()["staleness"] == {}


def browser_json(data: str):
    """JSON as the browser's JSON.parse reads it: NaN and Infinity are errors."""
    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(data, parse_constant=refuse)


def test_stream_sends_json_the_browser_can_parse(runs_root: Path) -> None:
    plant(runs_root / "nan", {"config.yaml": "trainer: {steps: 3}\n",
                              "status.json": json.dumps({"state": "finished", "started": float("nan")}),
                              "summary.json": json.dumps({"eval_after": {"pass_at_1": float("inf")}})})
    with serving(create_app(runs_root, poll_s=0.1)) as url:
        with httpx.stream("GET", f"{url}/api/stream", timeout=20) as response:
            for event, data in sse_events(response):
                if event == "runs":
                    runs = {r["name"]: r for r in browser_json(data)}
                    assert runs["nan"]["started"] is None and runs["nan"]["pass_after"] is None
                    break


# -- what the runs list says -------------------------------------------------------------------
def test_runs_list_shows_the_resumed_target_and_the_env(runs_root: Path) -> None:
    run = write_run(runs_root, "resumed", steps=4)
    record_changes(run, 2, {"trainer.steps": {"from": 4, "to": 60}})
    record_changes(run, 30, {"trainer.lr": {"from": 1e-5, "to": 2e-5}})
    plant(runs_root / "agentic", {"config.yaml": "trainer: {steps: 8}\ntask: {name: arith}\n"
                                                 "env: {name: frozenlake, kwargs: {}}\n"})
    plant(runs_root / "agent", {"config.yaml": "trainer: {steps: 8}\ntask: {name: arith}\n"
                                               "agent: {name: 'python:calc_agent.py:run', tasks: seeds}\n"})
    runs = {r["name"]: r for r in local_client(create_app(runs_root)).get("/api/runs").json()}
    assert (runs["resumed"]["step"], runs["resumed"]["steps"]) == (4, 60)
    assert runs["agentic"]["task"] == "frozenlake" and runs["agentic"]["env"] == "frozenlake"
    assert runs["done"]["task"] == "arith" and runs["done"]["env"] is None
    assert runs["agent"]["task"] == "python:calc_agent.py:run"  # the agent, not the default task section


@pytest.mark.parametrize("header,expected", [("127.0.0.1:8484", ("127.0.0.1", 8484)), ("[::1]:80", ("::1", 80)),
                                             ("LocalHost", ("localhost", None)), ("h:x", ("h", -1))])
def test_split_host(header: str, expected: tuple) -> None:
    from cadence.http_guards import split_host

    assert split_host(header) == expected
