"""Unattended runs: the supervisor resumes a dead trainer from its last checkpoint (with backoff,
restarts.jsonl, webhook), Ray restarts a dead rollout actor which reloads its state, and a run
killed at random several times finishes with every step logged exactly once."""

from __future__ import annotations

import http.server
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from cadence.config import load_config
from cadence.observe.metrics import read_jsonl
from cadence.runtime import supervisor
from cadence.runtime.actors import died_error
from tests.quick_run import QUICK_RUN


@pytest.fixture
def webhook():
    """A local HTTP server on 127.0.0.1 that keeps every JSON body POSTed to it."""
    received: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/hook", received
    finally:
        server.shutdown()
        server.server_close()


def _restarts(run: Path) -> list[dict]:
    path = run / supervisor.RESTARTS_FILE
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_exit_cause_names_the_signal_or_the_error():
    assert supervisor.exit_cause(-9, []) == "killed by SIGKILL"
    tail = ["Traceback (most recent call last):", '  File "x.py", line 1', "RuntimeError: rank 1 died", "bye"]
    assert supervisor.exit_cause(1, tail) == "exit code 1: RuntimeError: rank 1 died"


def test_supervisor_backs_off_records_and_gives_up(tmp_path, webhook, monkeypatch):
    url, received = webhook
    cfg = load_config(None, [f"logging.run_dir={tmp_path}", "runtime.max_restarts=2",
                             "runtime.restart_backoff_s=0.01", f"logging.webhook_url={url}"])
    calls, sleeps = [], []
    monkeypatch.setattr(supervisor, "_run_child", lambda args: (calls.append(args), (-9, []))[1])
    monkeypatch.setattr(supervisor.time, "sleep", sleeps.append)
    assert supervisor.supervise(cfg.runtime, cfg.logging, ["a=1"], resume=False) == -9
    assert calls == [["a=1"], ["a=1", "--resume"], ["a=1", "--resume"]]  # restarts resume
    assert sleeps == [0.01, 0.02]  # exponential backoff
    entries = _restarts(tmp_path)
    assert [e.get("restart") for e in entries] == [1, 2, None]
    assert entries[-1]["action"] == "gave up" and all(e["cause"] == "killed by SIGKILL" for e in entries)
    assert [m["event"] for m in received] == ["restarting", "restarting", "failed"]


def test_a_dead_critic_actor_is_recorded_as_the_critic_and_resumed(tmp_path, monkeypatch):
    cfg = load_config(None, [f"logging.run_dir={tmp_path}", "runtime.max_restarts=1", "runtime.restart_backoff_s=0"])
    died = ["Traceback (most recent call last):", '  File "critics.py", line 9, in update',
            f"cadence.runtime.actors.ActorDiedError: {died_error('critic actor', 'update: The actor died')}"]
    answers = iter([(1, died), (0, [])])
    calls = []
    monkeypatch.setattr(supervisor, "_run_child", lambda args: (calls.append(args), next(answers))[1])
    assert supervisor.supervise(cfg.runtime, cfg.logging, [], resume=False) == 0
    assert calls == [[], ["--resume"]]  # critic and policy resume together from the checkpoint
    (entry,) = _restarts(tmp_path)
    assert entry["role"] == "critic" and "ActorDiedError" in entry["cause"]
    assert supervisor.failed_role("exit code 1: RuntimeError: rank 1 died") == "trainer"


def test_supervisor_does_not_restart_a_config_error(tmp_path, monkeypatch):
    cfg = load_config(None, [f"logging.run_dir={tmp_path}", "runtime.max_restarts=3"])
    monkeypatch.setattr(supervisor, "_run_child", lambda args: (2, ["bad field"]))
    assert supervisor.supervise(cfg.runtime, cfg.logging, [], resume=False) == 2
    assert _restarts(tmp_path) == []


@pytest.fixture
def ray_head():
    """One local Ray head the runs join (runtime.address), so a restarted trainer connects in a second."""
    pytest.importorskip("ray")
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:
        ray.init(address=c.address, include_dashboard=False, logging_level="ERROR")  # to read its actor table
        yield c.address
    finally:
        ray.shutdown()
        c.shutdown()


def _steps(run: Path) -> list[int]:
    """The steps of the run's metrics log so far: whole lines only, as the trainer may be writing one."""
    return [record["step"] for record in read_jsonl(run / "metrics.jsonl")]


def _trainer(sup: psutil.Process) -> psutil.Process | None:
    kids = [p for p in sup.children() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    return kids[0] if kids else None


def _rollout_actor(since: float) -> psutil.Process | None:
    """A live rollout worker actor of this test's Ray cluster started after `since` (the current
    trainer's); from the cluster's actor table, never by process name (other Ray runs share the machine)."""
    import ray

    for actor in ray._private.state.actors().values():
        # The actor's start, not its process's: Ray runs actors in worker processes it started earlier.
        if actor["ActorClassName"].endswith("RolloutWorker") and actor["State"] == "ALIVE" and actor["Pid"] \
                and actor["StartTime"] / 1000 >= since:
            try:
                return psutil.Process(actor["Pid"])
            except psutil.NoSuchProcess:
                continue
    return None


def _wait_until_recorded(run: Path, sup: subprocess.Popen, deadline: float, kills: int) -> None:
    """Wait until the trainer has noticed the killed rollout actor and recorded its restart.

    The trainer notices a dead actor only at its next call to it, and records it once the
    replacement is up: seconds later on a loaded machine, by which time the trainer may have
    logged the next kill's step already. Killing the trainer then loses the rollout death with
    it (the new trainer starts new actors and never learns of it): the 1-in-4 failure of this
    test. A rollout kill counts as done once it is on record."""
    while time.time() < deadline and sup.poll() is None:
        if sum(e["role"] == "rollout" for e in _restarts(run)) >= kills:
            return
        time.sleep(0.05)
    pytest.fail(f"the rollout kill was never recorded in {supervisor.RESTARTS_FILE}: {_restarts(run)}")


@pytest.mark.slow
def test_run_killed_at_random_finishes_with_every_step_once(tmp_path, webhook, ray_head):
    url, received = webhook
    steps = 12
    run = tmp_path / "run"
    args = [*QUICK_RUN, f"trainer.steps={steps}", "checkpoint.every=2", "rollout.async_ratio=1",
            "runtime.threads=1", "runtime.kind=ray", f"runtime.address={ray_head}", "runtime.rollout_cpus=1",
            "runtime.max_restarts=3", "runtime.restart_backoff_s=0.2", f"logging.webhook_url={url}",
            f"logging.run_dir={run}"]
    rng = random.Random(17)
    roles = ["trainer", "rollout", "trainer"]
    rng.shuffle(roles)
    plan = list(zip(roles, sorted(rng.sample(range(2, steps - 3), 3)), strict=True))  # (what, after step)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    sup = subprocess.Popen([sys.executable, "-m", "cadence", "train", *args], cwd=tmp_path, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log: list[str] = []
    done: list[tuple[str, int]] = []  # (what was killed, the last step logged then)
    reader = threading.Thread(target=lambda: log.extend(sup.stdout), daemon=True)
    reader.start()
    try:
        parent = psutil.Process(sup.pid)
        deadline = time.time() + 300
        for role, after in plan:
            while time.time() < deadline:
                assert sup.poll() is None, f"the run ended before the {role} kill after step {after} (done: {done})"
                child = _trainer(parent)
                # The current trainer has logged past `after` (a resumed one first truncates the log).
                if child is not None and _steps(run) and _steps(run)[-1] >= after and \
                        (run / "metrics.jsonl").stat().st_mtime > child.create_time():
                    victim = child if role == "trainer" else _rollout_actor(child.create_time())
                    if victim is not None:
                        victim.send_signal(signal.SIGKILL)
                        done.append((role, _steps(run)[-1]))
                        if role == "rollout":
                            _wait_until_recorded(run, sup, deadline, sum(r == "rollout" for r, _ in done))
                        break
                time.sleep(0.05)
            else:
                pytest.fail(f"{role} kill after step {after} never came (done: {done}):\n{''.join(log)}")
        assert sup.wait(timeout=max(1, deadline - time.time())) == 0, "".join(log)
    finally:
        if sup.poll() is None:
            for p in [*psutil.Process(sup.pid).children(recursive=True), sup]:
                p.kill()
    reader.join(timeout=5)
    assert _steps(run) == list(range(1, steps + 1)), "".join(log)
    entries = _restarts(run)
    assert sorted(e["role"] for e in entries) == ["rollout", "trainer", "trainer"], entries
    assert all(e["cause"] == "killed by SIGKILL" for e in entries if e["role"] == "trainer")
    assert all(e["cause"] for e in entries if e["role"] == "rollout")
    assert [m["event"] for m in received] == ["restarting", "restarting", "finished"]
