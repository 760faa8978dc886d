"""connect_ray: one way into Ray; a Ray Client connection that fails to start is retried."""

from __future__ import annotations

import pytest

from cadence.runtime.config import RuntimeConfig
from cadence.runtime.connect import connect_ray

ray = pytest.importorskip("ray")


@pytest.fixture
def fake_ray(monkeypatch):
    """ray.init that fails `failures` times with the client server's error, then succeeds."""
    state = {"failures": 0, "inits": 0, "shutdowns": 0}

    def init(**kwargs):
        state["inits"] += 1
        state["kwargs"] = kwargs
        if state["inits"] <= state["failures"]:
            raise ConnectionAbortedError("Initialization failure from server:\nRuntimeError: Starting Ray client "
                                         "server failed. See ray_client_server_23000.err for detailed logs.")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: state.__setitem__("shutdowns", state["shutdowns"] + 1))
    return state


def test_a_client_server_that_fails_to_start_is_retried(fake_ray, caplog):
    fake_ray["failures"] = 2
    connect_ray(RuntimeConfig(kind="ray", address="ray://127.0.0.1:10001"), attempts=3, pause_s=0)
    assert fake_ray["inits"] == 3 and fake_ray["shutdowns"] == 2
    assert fake_ray["kwargs"]["address"] == "ray://127.0.0.1:10001"
    assert sum("attempt" in r.getMessage() for r in caplog.records) == 2


def test_the_last_failure_names_the_field_and_where_to_look(fake_ray):
    fake_ray["failures"] = 5
    with pytest.raises(RuntimeError, match=r"runtime.address=ray://127.0.0.1:10001.*3 attempts.*ray_client_server"):
        connect_ray(RuntimeConfig(kind="ray", address="ray://127.0.0.1:10001"), attempts=3, pause_s=0)
    assert fake_ray["inits"] == 3


def test_a_cluster_address_is_not_retried(fake_ray):
    # Only Ray Client starts a server per connection; a failure to join a cluster directly is final.
    fake_ray["failures"] = 1
    with pytest.raises(ConnectionError):
        connect_ray(RuntimeConfig(kind="ray", address="127.0.0.1:6379"), attempts=3, pause_s=0)
    assert fake_ray["inits"] == 1


def test_an_initialised_ray_is_left_alone(monkeypatch):
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "init", lambda **_: pytest.fail("ray.init called twice"))
    connect_ray(RuntimeConfig(kind="ray", address="ray://127.0.0.1:10001"))
