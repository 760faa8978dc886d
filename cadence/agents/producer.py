"""Agent runs as a `GroupProducer`: a group is `group_size` runs of a user's agent on one task.

    async def run(client: openai.AsyncOpenAI, task, **kwargs) -> float | dict: ...

Each run gets its own address on the `AgentEndpoint` and a client pointed at
it; whatever the agent asks through that client is recorded token for token,
and when it returns, its trajectory's samples (one, or several when it rewrote
its history; see trajectory.py) carry its reward. A dict return carries the
reward under "reward".

Lost runs. A run that raises, runs past `timeout_s`, returns no number, or
returns without one request through its client is lost: counted, and replaced
by a new run on the same task, up to `max_retries` per group. A group trains on
the runs that finished (dropped when none did). The rule is the environments'
(cadence/rollout/failures.py): the first failure of each kind is printed
with its traceback from the agent's code on and kept in `<run>/env_errors.log`,
and a run whose first groups (nearly) all fail stops with `ProducerFailing`
naming `agent.name` and the cause.

Weighting when a run splits. A run whose agent rewrote its history (or whose
template re-renders earlier turns) becomes k > 1 samples. The rule:

- each of the k samples carries the run's whole reward (never reward / k), so
  every piece of the run is pushed in the direction of the run's outcome;
- every token the engine sampled is in exactly one sample (trajectory.py), so
  under token-level aggregation (`token-mean`, `seq-mean-token-sum-norm`) a
  sampled token weighs the same whether or not its run split;
- a group is the samples of its runs: group statistics (GRPO's mean and std,
  RLOO's leave-one-out) count samples, so a run split k ways enters its
  group's baseline k times, and under `seq-mean-*` aggregation it counts as k
  sequences. Splits are counted (`agent/rewrite`, `agent/rerender`) so a run
  where they are common shows it.

Each run's client has its own connections (one pool shared by hundreds of runs
is scanned per request: quadratic) but all share one TLS context: loading one
per client costs ~100 ms of CPU, on the loop every run shares.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import sysconfig
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx
import openai

from cadence.agents.canaries import Canaries
from cadence.agents.config import AgentConfig
from cadence.agents.endpoint import AgentEndpoint
from cadence.agents.grader import Grader
from cadence.agents.task_sandbox import TaskGroup, TaskSandboxes
from cadence.agents.trajectory import Trajectory
from cadence.rollout.evaluate import EvalResult
from cadence.rollout.failures import AGENT_RUNS, Failures, OpenGroup, RunFailure, stale
from cadence.rollout.rlvr import eval_result
from cadence.rollout.sample import Group, Sample
from cadence.sandbox.models import SandboxError

AgentFn = Callable[..., Awaitable[float | dict]]

# Frames in these folders are ours or Python's: a failure's traceback starts after them.
_NOT_USER = (os.path.dirname(os.path.abspath(__file__)) + os.sep, sysconfig.get_paths()["stdlib"] + os.sep)


class AgentLost(RuntimeError):
    """An agent run that produced nothing to train on."""


class LostPerTask:
    """Runs and lost runs per training task. A lost run is replaced by another try on the same
    task and the group trains on the runs that finished, so a policy that fails its runs on the
    tasks it would score low on (a reply that broke the endpoint) hides those rewards: the task
    whose runs are lost most often shows it (metrics, and the dashboard's lost-episodes line)."""

    def __init__(self) -> None:
        self.runs: Counter[int] = Counter()
        self.lost: Counter[int] = Counter()

    def record(self, task: int, runs: int, lost: int) -> None:
        self.runs[task] += runs
        if lost:
            self.lost[task] += lost

    def metrics(self) -> dict[str, float]:
        """agent/worst_task (its index), its runs and lost runs, and how many tasks lost any."""
        if not self.lost:
            return {}
        worst = max(self.lost, key=lambda t: (self.lost[t] / self.runs[t], self.runs[t]))
        return {"agent/worst_task": float(worst), "agent/worst_task_runs": float(self.runs[worst]),
                "agent/worst_task_lost_runs": float(self.lost[worst]), "agent/tasks_losing_runs": float(len(self.lost))}


class AgentProducer:
    """Groups of agent runs through the endpoint (see the module docstring)."""

    needs_running_loop = True  # agents wait on their tools: the loop turns while the trainer trains

    def __init__(self, endpoint: AgentEndpoint, agent: AgentFn, tasks: Sequence[Any], group_size: int,
                 eval_tasks: Sequence[Any] = (), first_key: int = 0, kwargs: dict | None = None,
                 timeout_s: float | None = None, max_retries: int | None = None,
                 failures: Failures | None = None, sandboxes: TaskSandboxes | None = None,
                 grader: Grader | None = None, canaries: Canaries | None = None) -> None:
        if not tasks:
            raise ValueError("AgentProducer needs at least one task")
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.endpoint = endpoint
        self.agent = agent
        self.kwargs = dict(kwargs or {})
        self.tasks = tasks
        self.eval_tasks = eval_tasks
        self.group_size = group_size
        self.timeout_s = timeout_s
        self.max_retries = 2 * group_size if max_retries is None else max_retries
        self.failures = failures or Failures("the agent", AGENT_RUNS, echo=False)
        self.first_key = first_key  # a key is a task's index (modulo the task list)
        self.version = 0
        self.counts: Counter[str] = Counter()  # runs started, samples
        self.lost_per_task = LostPerTask()
        self.open: dict[int, OpenGroup] = {}  # group id -> its runs in flight
        self.sandboxes, self.grader, self.canaries = sandboxes, grader, canaries
        self.returned: list[float] = []  # the agents' own rewards since the last metrics (grader runs)
        self._tls = ssl.create_default_context()
        self._starting: asyncio.Future | None = None

    # -- the producer protocol -------------------------------------------------
    async def start(self) -> None:
        """Start the endpoint on the loop the hub serves (again after a stop). Every run waits for
        the start to end: `serving` turns true before the start has read the port it bound."""
        if self._starting is None or (self._starting.done() and not self.endpoint.serving):
            self._starting = asyncio.ensure_future(self.endpoint.start())
        await asyncio.shield(self._starting)

    async def play(self, key: int, group_id: int) -> Group | None:
        """Run `group_size` agents on task `key` (modulo the task list); their samples."""
        index = key % len(self.tasks)
        task = self.tasks[index]
        canary = self.canaries.row(key) if self.canaries is not None else None
        if canary is not None:
            task, index = canary, f"canary-{key}"
        try:
            group = await self.sandboxes.open_group(task, self.group_size) if self.sandboxes is not None else None
        except SandboxError as exc:  # the task's workspace could not be prepared: no run can play it
            self._lost(RunFailure("raised", f"task sandbox: {exc}"), index)
            self.failures.group_ended(kept=False)
            self.failures.check()
            return None
        runs = {asyncio.ensure_future(self._run(task, index, group, canary is not None)) for _ in range(self.group_size)}
        self.open[group_id] = opened = OpenGroup(self.version, runs)
        finished: list[tuple[float, Trajectory]] = []
        lost = 0
        try:
            while runs:
                done, _ = await asyncio.wait(runs, return_when=asyncio.FIRST_COMPLETED)
                for run in done:
                    runs.discard(run)
                    if run.cancelled():
                        continue
                    if run.exception() is None:
                        finished.append(run.result())
                        continue
                    lost += 1
                    if self.failures.retry(opened, self.max_retries):  # lost (reported in _run): again
                        runs.add(asyncio.ensure_future(self._run(task, index, group, canary is not None)))
                self.failures.check()
                if self.canaries is not None:
                    self.canaries.check()
        finally:
            self.open.pop(group_id, None)
            for run in runs:
                run.cancel()
            if group is not None:  # its runs' sandboxes first (each releases its own), then the group's
                await asyncio.shield(_close_group(group, runs))
        if canary is None:
            self.lost_per_task.record(index, len(finished) + lost, lost)
        samples: list[Sample] = []
        for reward, trajectory in finished:
            samples += trajectory.samples(reward, group_id, f"task-{index}")
        self.failures.group_ended(kept=bool(samples))
        if not samples:
            self.failures.check()
            return None
        self.counts["samples"] += len(samples)
        return Group(group_id, samples[0].prompt_id, samples)

    def on_weights(self, version: int, cancel_before: int | None) -> None:
        self.version = version
        if cancel_before is not None:
            for opened in stale(self.open, cancel_before):
                for run in opened.plays:
                    run.cancel()

    async def evaluate(self, samples: int) -> EvalResult:
        """Held-out success: every eval task `samples` times; a reward >= 1 is a success. With
        agent.canaries, canary rows in training's share (one per `every` eval tasks, at least one)
        also play once each: the share whose reward is >= 1 (every hidden test passed) is the
        canary pass rate. These runs touch neither training's counters nor its threshold."""
        if not self.eval_tasks:
            raise ValueError("AgentProducer.evaluate needs eval_tasks")
        tasks = list(self.eval_tasks)
        canaries = self._eval_canaries(len(tasks))
        plays = [self._run(t, f"eval {i}") for i, t in enumerate(tasks) for _ in range(samples)]
        plays += [self._run(row, f"eval canary {i}") for i, row in enumerate(canaries)]
        outcomes = await asyncio.gather(*plays, return_exceptions=True)
        all_rewards = [0.0 if isinstance(o, BaseException) else o[0] for o in outcomes]
        rewards, canary_rewards = all_rewards[:len(tasks) * samples], all_rewards[len(tasks) * samples:]
        correct = [sum(r >= 1.0 for r in rewards[i * samples:(i + 1) * samples]) for i in range(len(tasks))]
        result = eval_result(correct, samples, rewards)
        if canaries:
            result.canary_pass_rate = sum(r >= 1.0 for r in canary_rewards) / len(canaries)
            result.canaries = len(canaries)
        return result

    def _eval_canaries(self, eval_tasks: int) -> list[dict]:
        if self.canaries is None:
            return []
        rows = self.canaries.rows
        return [rows[i % len(rows)] for i in range(max(1, -(-eval_tasks // self.canaries.cfg.every)))]

    def metrics(self) -> dict[str, float]:
        f = self.failures
        counts = {"runs": self.counts["runs"], "runs_played": f.played, "runs_lost": f.lost, "runs_retried": f.retried,
                  "runs_cancelled": f.cancelled, "groups": f.groups_done + f.groups_dropped,
                  "groups_dropped": f.groups_dropped, "samples": self.counts["samples"]}
        out = {f"agent/{k}_total": float(v) for k, v in counts.items()}
        out.update(self.lost_per_task.metrics())
        if self.sandboxes is not None:
            out.update(self.sandboxes.metrics())
        if self.grader is not None:
            out.update({f"agent/grader_{k}_total": float(v) for k, v in self.grader.counts.items()})
            if self.returned:
                out["agent/returned_reward_mean"] = sum(self.returned) / len(self.returned)
            self.returned = []
        if self.canaries is not None:
            out.update(self.canaries.metrics())
        return {**out, **self.endpoint.metrics()}

    def health(self) -> dict:
        """Runs played, lost, retried; groups dropped; the first failure of each kind (rewards come
        from the agent's return or the grader: no reward function to fail)."""
        return {"runs": self.failures.health()}

    async def stop(self) -> None:
        runs = [r for opened in self.open.values() for r in opened.plays]
        for run in runs:
            run.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
        # The server is a task on the worker's loop: end it while that loop still runs (a later
        # evaluation starts it again, on a new port).
        await self.endpoint.stop()
        if self.sandboxes is not None:  # every sandbox still leased, the HTTP door, the pool
            await self.sandboxes.close()

    def close(self) -> None:
        pass  # each run closes its own client

    # -- one run ------------------------------------------------------------------
    async def _run(self, task: Any, label: int | str, group: TaskGroup | None = None,
                   canary: bool = False) -> tuple[float, Trajectory]:
        """One run; with agent.sandbox, in a sandbox of its own (of `group`, else of a group of one
        opened for it: evaluation), released when it ends, and graded with agent.grader."""
        if self.sandboxes is None:
            return await self._play(task, label)
        if group is not None:
            return await self._in_sandbox(task, label, group, canary)
        group = await self.sandboxes.open_group(task)
        try:
            return await self._in_sandbox(task, label, group, canary)
        finally:
            await group.close()

    async def _in_sandbox(self, row: dict, label: int | str, group: TaskGroup,
                          canary: bool) -> tuple[float, Trajectory]:
        hidden = self.grader.hidden() if self.grader is not None else ()
        entered = False
        try:
            async with group.run() as sandbox:
                entered = True
                returned, trajectory = await self._play(sandbox.task(row, hidden), label)
                try:
                    after = await sandbox.snapshot() if self.grader is not None else None
                except SandboxError as exc:  # its sandbox died under it: lost (and replayed), not scored 0
                    self._lost(RunFailure("raised", f"task sandbox: {exc}"), label, played=True)
                    raise AgentLost(f"task sandbox: {exc}") from exc
        except SandboxError as exc:
            if entered:  # the agent's own call failed: counted by _play
                raise
            # No sandbox with the task's workspace could be had (its spares died): lost and replayed too.
            self._lost(RunFailure("raised", f"task sandbox: {exc}"), label)
            raise AgentLost(f"task sandbox: {exc}") from exc
        if self.grader is None or after is None:
            return returned, trajectory
        # Graded after the run's sandbox is gone: nothing it left running reaches the grading.
        try:
            report = await self.grader.grade(group, row, self.grader.changes(row, group.pristine, after))
        except Exception as exc:  # a row the grader cannot use (no hidden tests): said once, loud
            self._lost(RunFailure("raised", f"grading: {type(exc).__name__}: {exc}"), label, played=True)
            raise AgentLost(f"grading: {exc}") from exc
        reward = self.grader.score(report)
        self.returned.append(returned)
        if self.grader.cfg.agent_reward == "add":
            reward += returned
        if canary and self.canaries is not None:
            self.canaries.record(report["error"] is None and report["passed"] == report["total"])
        return reward, trajectory

    async def _play(self, task: Any, label: int | str) -> tuple[float, Trajectory]:
        await self.start()  # the worker started it already; a producer driven alone starts here
        run_id = self.endpoint.open_run()
        http = httpx.AsyncClient(verify=self._tls, timeout=None)
        client = openai.AsyncOpenAI(base_url=self.endpoint.run_url(run_id), api_key=run_id, max_retries=0,
                                    http_client=http)
        self.counts["runs"] += 1
        failure: RunFailure | None = None
        try:
            returned = await asyncio.wait_for(self.agent(client, task, **self.kwargs), self.timeout_s)
            reward = _reward(returned)
        except asyncio.CancelledError:
            self.failures.cancelled += 1
            raise
        except TimeoutError:
            failure = RunFailure("timeout", f"run took longer than {self.timeout_s:g} s (agent.timeout_s)")
            raise
        except Exception as exc:
            failure = RunFailure("raised", f"run: {type(exc).__name__}: {exc}", traceback=_user_traceback(exc))
            raise
        finally:
            trajectory = self.endpoint.close_run(run_id)
            await http.aclose()
            if failure is None and trajectory.counts["requests"] == 0 and not self._cancelled():
                failure = RunFailure("raised", "run: the agent returned without a request through the client it "
                                     "was given (use that client, or its base_url)")
            if failure is not None:
                self._lost(failure, label)
        if trajectory.counts["requests"] == 0:
            raise AgentLost(failure.message if failure else "no request")
        self.failures.finished()
        return reward, trajectory

    def _lost(self, failure: RunFailure, label: int | str, played: bool = False) -> None:
        """`played`: the run was counted as played already (it failed after its agent returned)."""
        self.failures.record_lost(failure, label, played)

    @staticmethod
    def _cancelled() -> bool:
        task = asyncio.current_task()
        return task is not None and task.cancelling() > 0


def sandbox_and_grading(agent: AgentConfig) -> dict[str, Any]:
    """AgentProducer's keyword arguments for agent.sandbox, agent.grader and agent.canaries."""
    return {"sandboxes": TaskSandboxes(agent.sandbox) if agent.sandbox is not None else None,
            "grader": Grader(agent.grader) if agent.grader is not None else None,
            "canaries": Canaries(agent.canaries) if agent.canaries is not None else None}


async def _close_group(group: TaskGroup, runs: set[asyncio.Task]) -> None:
    await asyncio.gather(*runs, return_exceptions=True)
    await group.close()


def _reward(returned: Any) -> float:
    """The reward an agent returned: a number, or a dict's "reward"."""
    value = returned.get("reward") if isinstance(returned, dict) else returned
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"the agent returned {returned!r}: return the reward as a number, or a dict with a "
                        "numeric 'reward'")
    return float(value)


def _user_traceback(exc: BaseException) -> str:
    """The traceback from the first frame outside cadence/agents and the standard library."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename.startswith(_NOT_USER):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


__all__ = ["AgentLost", "AgentProducer"]
