"""The typed handle (`cadence.runtime.actors`) in this process and in a spawned process; the Ray
transport and its recovery are exercised end to end by test_actor_recovery / test_rollout_recovery."""

from __future__ import annotations

import os
import signal

import pytest

from cadence.observe.metrics import read_jsonl
from cadence.runtime.actors import (
    ActorDiedError,
    Local,
    Process,
    Recovery,
    RemoteCallError,
    call_all,
)


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.count = start

    def add(self, n: int) -> int:
        self.count += n
        return self.count

    def fail(self) -> None:
        raise ValueError("no such thing")


class Doubler(Counter):
    def add(self, n: int) -> int:  # an override is what runs, whatever class names the method
        return super().add(2 * n)


def test_a_call_names_the_method_by_its_class_and_runs_the_objects_own():
    counter, doubler = Local(Counter()), Local(Doubler(10))
    assert counter.call(Counter.add, 3) == 3
    assert call_all([counter, doubler], Counter.add, 1) == [4, 12]


def test_a_process_answers_calls_raises_their_errors_and_names_its_death():
    worker = Process(Counter, "counter 0")
    try:
        worker.started()
        assert worker.call(Counter.add, 5) == 5 and worker.call(Counter.add, 1) == 6  # its state stays there
        with pytest.raises(RemoteCallError, match=r"(?s)the counter 0 failed:.*ValueError: no such thing"):
            worker.call(Counter.fail)
        os.kill(worker.proc.pid, signal.SIGKILL)
        worker.proc.join(timeout=10)
        with pytest.raises(ActorDiedError, match=r"the counter 0 died \(add: exit code -9\).*resume from the last"):
            worker.call(Counter.add, 1)
    finally:
        worker.close()


def test_recovery_records_each_restart_and_allows_no_more_than_its_limit(tmp_path):
    recovery = Recovery("rollout", max_restarts=1, run_dir=tmp_path)
    recovery.allow("rollout worker 1", "get_batch: died")
    recovery.record("rollout worker 1", "get_batch: died", {"worker": 1})
    with pytest.raises(ActorDiedError, match=r"after 1 restart\(s\) of rollout actors; runtime.actor_restarts=1"):
        recovery.allow("rollout worker 0", "metrics: died")
    (entry,) = read_jsonl(tmp_path / "restarts.jsonl")
    assert entry["role"] == "rollout" and entry["worker"] == 1 and entry["restart"] == 1
    Recovery("actor_attn", max_restarts=-1).allow("actor_attn actor", "no limit")
