"""Agent runs as a `GroupProducer`: a group is `group_size` runs of a user's agent on one task.

    async def run(client: openai.AsyncOpenAI, task) -> float | dict: ...

Each run gets its own key on the `AgentEndpoint` and a client pointed at it;
whatever the agent asks through that client is recorded token for token, and
when it returns, its trajectory's samples (one, or several when it rewrote its
history; see trajectory.py) carry its reward. A dict return carries the reward
under "reward". A run that raises, or returns without one request through its
client, is lost: counted, its first traceback kept, the group trains on the
runs that finished (None when none did).

Each run's client has its own connections (one pool shared by hundreds of runs
is scanned per request: quadratic) but all share one TLS context: loading one
per client costs ~100 ms of CPU, on the loop every run shares.
"""

from __future__ import annotations

import asyncio
import ssl
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx
import openai

from cadence.agents.endpoint import AgentEndpoint
from cadence.rollout.evaluate import EvalResult
from cadence.rollout.producer import TrainedKeys
from cadence.rollout.rlvr import eval_result
from cadence.rollout.sample import Group, Sample

AgentFn = Callable[[openai.AsyncOpenAI, Any], Awaitable[float | dict]]


class AgentLost(RuntimeError):
    """An agent run that produced nothing to train on."""


class AgentProducer:
    """Groups of agent runs through the endpoint (see the module docstring)."""

    needs_running_loop = True  # agents wait on their tools: the loop turns while the trainer trains

    def __init__(self, endpoint: AgentEndpoint, agent: AgentFn, tasks: Sequence[Any], group_size: int,
                 eval_tasks: Sequence[Any] = (), first_key: int = 0) -> None:
        if not tasks:
            raise ValueError("AgentProducer needs at least one task")
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.endpoint = endpoint
        self.agent = agent
        self.tasks = list(tasks)
        self.eval_tasks = list(eval_tasks)
        self.group_size = group_size
        self.next = first_key
        self.version = 0
        self.counts: Counter[str] = Counter()
        self.first_failure: str | None = None
        self.open: dict[int, tuple[int, list[asyncio.Task]]] = {}  # group id -> (version, its runs)
        self._tls = ssl.create_default_context()
        self._starting: asyncio.Future | None = None

    # -- the producer protocol -------------------------------------------------
    def next_key(self) -> int:
        key, self.next = self.next, self.next + 1
        return key

    async def play(self, key: int, group_id: int) -> Group | None:
        """Run `group_size` agents on task `key` (modulo the task list); their samples."""
        task = self.tasks[key % len(self.tasks)]
        runs = [asyncio.create_task(self._run(task)) for _ in range(self.group_size)]
        self.open[group_id] = (self.version, runs)
        try:
            finished = await asyncio.gather(*runs, return_exceptions=True)
        finally:
            self.open.pop(group_id, None)
        samples: list[Sample] = []
        for outcome in finished:
            if isinstance(outcome, BaseException):
                continue  # lost (counted in _run) or cancelled
            reward, trajectory = outcome
            samples += trajectory.samples(reward, group_id, f"task-{key % len(self.tasks)}")
        self.counts["groups"] += 1
        if not samples:
            self.counts["groups_dropped"] += 1
            return None
        self.counts["samples"] += len(samples)
        return Group(group_id, samples[0].prompt_id, samples)

    def on_weights(self, version: int, cancel_before: int | None) -> None:
        self.version = version
        if cancel_before is not None:
            for started, runs in list(self.open.values()):
                if started < cancel_before:
                    for run in runs:
                        run.cancel()

    async def evaluate(self, samples: int) -> EvalResult:
        """Held-out success: every eval task `samples` times; a reward >= 1 is a success."""
        if not self.eval_tasks:
            raise ValueError("AgentProducer.evaluate needs eval_tasks")
        outcomes = await asyncio.gather(*(self._run(t) for t in self.eval_tasks for _ in range(samples)),
                                        return_exceptions=True)
        rewards = [0.0 if isinstance(o, BaseException) else o[0] for o in outcomes]
        correct = [sum(r >= 1.0 for r in rewards[i * samples:(i + 1) * samples]) for i in range(len(self.eval_tasks))]
        return eval_result(correct, samples, rewards)

    def metrics(self) -> dict[str, float]:
        out = {f"agent/{k}_total": float(v) for k, v in self.counts.items()}
        return {**out, **self.endpoint.metrics()}

    def reward_report(self) -> dict:
        """Rewards come from the agent's return: no reward function to fail."""
        return {"calls": 0, "errors": 0, "timeouts": 0, "first_failures": {}}

    def state_dict(self, trained: TrainedKeys) -> dict:
        return {"next_key": self.next}

    def load_state_dict(self, state: dict) -> TrainedKeys:
        self.next = state["next_key"]
        return TrainedKeys(self.next)

    async def cancel(self) -> None:
        runs = [r for _, group in self.open.values() for r in group]
        for run in runs:
            run.cancel()
        await asyncio.gather(*runs, return_exceptions=True)

    def close(self) -> None:
        pass  # each run closes its own client

    # -- one run ------------------------------------------------------------------
    async def _run(self, task: Any):
        if not self.endpoint.serving:  # start it here: on the loop the hub serves (once)
            if self._starting is None or self._starting.done():
                self._starting = asyncio.ensure_future(self.endpoint.start())
            await asyncio.shield(self._starting)
        run_id = self.endpoint.open_run()
        http = httpx.AsyncClient(verify=self._tls, timeout=None)
        client = openai.AsyncOpenAI(base_url=self.endpoint.run_url(run_id), api_key=run_id, max_retries=0,
                                    http_client=http)
        self.counts["runs"] += 1
        try:
            returned = await self.agent(client, task)
            reward = float(returned["reward"] if isinstance(returned, dict) else returned)
        except asyncio.CancelledError:
            self.counts["runs_cancelled"] += 1
            raise
        except Exception:
            self.counts["runs_lost"] += 1
            if self.first_failure is None:
                self.first_failure = traceback.format_exc()
            raise
        finally:
            trajectory = self.endpoint.close_run(run_id)
            await http.aclose()
        if trajectory.counts["requests"] == 0:
            self.counts["runs_lost"] += 1
            raise AgentLost("the agent returned without a request through the client it was given")
        return reward, trajectory
