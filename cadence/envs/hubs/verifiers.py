"""verifiers environments (the Environments Hub) as a cadence agent: they talk to an OpenAI client.

    agent.name=python:cadence.envs.hubs.verifiers:run agent.kwargs.env=<env id> agent.tasks=seeds

A verifiers environment is a module with ``load_environment(**env_args)``
(installed from the Environments Hub, or any importable module): it brings its
dataset, its conversation loop (single-turn, multi-turn, tools) and its rubric.
`run` is an agent of cadence's agent contract (docs/agents.md): each run plays
one row of the environment's dataset (``seed % len(dataset)`` for
``agent.tasks=seeds``; a task row's ``example_id`` or its index otherwise)
through verifiers' own rollout with `client` (cadence's endpoint: every request
is sampled and trained token for token) and returns the rubric's reward.

This is verifiers' classic API (``import verifiers as vf``: 0.3.x; 0.4 keeps
only its v1 stack, which runs agents as programs prepared with uv).
"""

from __future__ import annotations

import functools
import json
import signal
import threading
import types
from typing import Any

INSTALL = "pip install 'cadence[envs-verifiers]'"
AS_AGENT = "agent.name=python:cadence.envs.hubs.verifiers:run agent.kwargs.env={}"


def env_class(ident: str) -> type:
    """env.name=verifiers:<id> is not an environment: it says how a verifiers environment trains."""
    raise ValueError(
        f"env.name 'verifiers:{ident}': verifiers environments talk to an OpenAI client, so they "
        f"train as agents: drop env.name and set {AS_AGENT.format(ident)}"
    )


_LOAD_LOCK = threading.Lock()


@functools.cache
def _environment(env: str, env_args_json: str) -> Any:
    """The verifiers environment `env`, loaded once per process per setting."""
    try:
        import verifiers as vf
        from verifiers.legacy.envs import environment as vf_environment
    except ImportError as exc:
        raise ImportError(
            f"agent.kwargs.env={env!r} needs verifiers' classic API (verifiers>=0.3.1,<0.4): {INSTALL}"
        ) from exc
    # A verifiers Environment installs SIGINT/SIGTERM handlers when it is made: that fails
    # outside the main thread (agent runs are in the rollout worker's), and would replace
    # cadence's own handlers in it. Its `signal` sees a no-op setter while it loads
    # (its atexit teardown stays).
    quiet = types.SimpleNamespace(**{**vars(signal), "signal": lambda *_: None})
    with _LOAD_LOCK:
        vf_environment.signal = quiet
        try:
            return vf.load_environment(env, **json.loads(env_args_json))
        finally:
            vf_environment.signal = signal


def environment(env: str, env_args: dict[str, Any] | None = None) -> Any:
    """The loaded environment (cached: its dataset is built once)."""
    return _environment(env, json.dumps(env_args or {}, sort_keys=True))


def rollout_input(vf_env: Any, task: Any) -> dict[str, Any]:
    """The dataset row a task plays: `seed % len` for a seed, else the row its example_id names."""
    dataset = vf_env.get_dataset()
    index = task.get("example_id", task.get("index", 0)) if isinstance(task, dict) else int(task)
    row = dict(dataset[int(index) % len(dataset)])
    row.setdefault("example_id", int(index) % len(dataset))
    return row


async def run(
    client: Any,
    task: Any,
    env: str,
    env_args: dict[str, Any] | None = None,
    model: str = "cadence",
    sampling_args: dict[str, Any] | None = None,
) -> float:
    """One rollout of verifiers environment `env` on `task` through `client`; the rubric's reward."""
    from verifiers.clients import OpenAIChatCompletionsClient

    vf_env = environment(env, env_args)
    output = await vf_env.run_rollout(
        rollout_input(vf_env, task), OpenAIChatCompletionsClient(client), model, dict(sampling_args or {})
    )
    error = output.get("error")
    if error:  # verifiers keeps a failed rollout's error in its output instead of raising it
        cause = error.get("error_chain_repr", error) if isinstance(error, dict) else error
        raise RuntimeError(f"verifiers rollout of {env!r} failed: {cause}")
    return float(output["reward"])
