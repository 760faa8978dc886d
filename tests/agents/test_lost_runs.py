"""A lost run is retried on the same task and the group trains on the runs that finished, so
losing runs is a way out of a low reward; the task that loses runs most often is counted and
shown (issue 33, finding 5): the metrics name it, the dashboard's lost-episodes card says so."""

from __future__ import annotations

from pathlib import Path

from cadence.dashboard.episodes import lost_episodes
from tests.agents.test_producer import calculator_agent, play


async def fails_on_hard_tasks(client, task) -> dict:
    """Breaks its run where it would score low (here: the task with b == 9), after a request."""
    result = await calculator_agent(client, task)
    if task["b"] == 9:
        raise RuntimeError("the endpoint answered 500")  # what a reply that broke it looked like
    return result


def test_the_task_that_loses_runs_most_often_is_counted_and_shown(tmp_path: Path):
    tasks = [{"a": 2, "b": 3}, {"a": 2, "b": 9}]
    producer, _, groups, _ = play(fails_on_hard_tasks, tasks, keys=4, group_size=2, max_retries=1)
    assert [g is None for g in groups] == [False, True, False, True]
    metrics = producer.metrics()
    # task 1: two groups of 2 runs and 1 retry each, every one lost; task 0 lost none.
    assert (metrics["agent/worst_task"], metrics["agent/worst_task_lost_runs"], metrics["agent/worst_task_runs"],
            metrics["agent/tasks_losing_runs"]) == (1.0, 6.0, 6.0, 1.0)
    shown = lost_episodes(tmp_path, metrics)
    assert shown["lost"] == {"agent runs": metrics["agent/runs_lost_total"]} and shown["lost"]["agent runs"] >= 6
    assert shown["worst_task"] == {"task": 1, "runs": 6, "lost": 6, "tasks": 1}
