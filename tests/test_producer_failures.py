"""The shared failure rule of episodes and agent runs (cadence/rollout/failures.py), on its own:
counting, the first failure of each kind, the retry budget, and when a run stops."""

from __future__ import annotations

import pytest

from cadence.envs.runner import EnvFailure
from cadence.rollout.failures import (
    AGENT_RUNS,
    Failures,
    OpenGroup,
    ProducerFailing,
    RunFailure,
    stale,
)


def _lose(failures: Failures, n: int, kind: str = "raised") -> None:
    for key in range(n):
        failures.record_lost(EnvFailure(kind, "step", f"step: boom {key}", traceback="Traceback\nValueError\n"), key)


def test_each_kind_is_reported_once_with_its_traceback_and_counted_every_time(tmp_path, capsys):
    log = tmp_path / "run" / "logs" / "env_errors.log"  # its folders made on the first report
    failures = Failures("python:games:Broken", log=log)
    _lose(failures, 3)
    failures.record_lost(EnvFailure("timeout", "reset", "reset took longer than 5 s"), 7)
    failures.finished()
    text = log.read_text()
    assert text.count("was lost") == 2 == capsys.readouterr().err.count("was lost")
    assert "environment python:games:Broken: an episode (seed 0) was lost: raised during step: step: boom 0" in text
    assert "Traceback\nValueError" in text and "(seed 7) was lost: timeout during reset" in text
    assert (failures.played, failures.lost, failures.lost_by_kind["raised"]) == (5, 4, 3)
    assert failures.kinds == {"raised during step": 3, "timeout during reset": 1}
    health = failures.health()
    assert health["played"] == 5 and health["lost"] == 4
    assert health["first_failures"] == {"raised during step": "Traceback\nValueError\n",
                                        "timeout during reset": "reset took longer than 5 s"}


def test_a_run_lost_after_it_was_counted_as_played_is_not_played_twice():
    failures = Failures("a", AGENT_RUNS, echo=False)
    failures.finished()
    failures.record_lost(RunFailure("raised", "grading: KeyError"), "task 3", played=True)
    assert (failures.played, failures.lost) == (1, 1)


def test_a_group_retries_up_to_its_budget():
    failures, group = Failures("e", echo=False), OpenGroup(version=0)
    assert [failures.retry(group, 2) for _ in range(3)] == [True, True, False]
    assert group.retries == failures.retried == 2


def test_stale_groups_are_those_started_before_a_version():
    groups = {1: OpenGroup(version=0), 2: OpenGroup(version=1), 3: OpenGroup(version=2)}
    assert stale(groups, 2) == [groups[1], groups[2]] and stale(groups, 0) == []


def test_nearly_everything_lost_before_any_group_completed_stops_the_run_naming_the_cause():
    failures = Failures("python:my_agent.py:run", AGENT_RUNS, echo=False)
    _lose(failures, 7)
    failures.check()  # 7 plays: too few to judge
    _lose(failures, 1)
    with pytest.raises(ProducerFailing) as failing:
        failures.check()
    message = str(failing.value)
    assert message.startswith("agent.name=python:my_agent.py:run: 8 of 8 runs were lost and no group completed")
    assert "most often raised during step: step: boom 0" in message and "fix the agent" in message


def test_a_run_that_completed_a_group_never_stops_and_one_that_loses_a_tenth_goes_on():
    failures = Failures("e", echo=False)
    for _ in range(10):
        failures.finished()
    _lose(failures, 89)
    failures.check()  # 89 of 99 lost: just under the broken fraction
    _lose(failures, 1)  # 90 of 100: at it
    with pytest.raises(ProducerFailing):
        failures.check()
    failures.group_ended(kept=True)
    failures.check()  # a group completed: the environment works, sometimes
    assert (failures.health()["groups"], failures.health()["groups_dropped"]) == (1, 0)


def test_three_groups_dropped_before_any_completed_stop_the_run():
    failures = Failures("e", echo=False)
    for _ in range(2):
        failures.group_ended(kept=False)
    failures.check()
    failures.group_ended(kept=False)
    with pytest.raises(ProducerFailing, match=r"env.name=e: 0 of 0 episodes were lost .*\(3 dropped\); most often lost: \. "
                       r"The first failure of each kind is in the output above; fix the environment"):
        failures.check()
