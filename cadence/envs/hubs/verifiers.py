"""verifiers environments (verifiers 0.4, its v1 stack) as a cadence agent.

    agent.name=python:cadence.envs.hubs.verifiers:run agent.kwargs.env=<taskset id> agent.tasks=seeds

A verifiers environment is a taskset package (an installed module exporting its
``Taskset`` subclass in ``__all__``: from the Environments Hub, or any
importable module), played by an agent: a harness program (``null``: a plain
chat loop; ``bash``; Codex, ...) in a runtime (``subprocess`` on this machine;
Docker, Prime sandboxes, ...). Its settings are vf-eval's, as a mapping:

    vf-eval <id> --env.taskset.count 4 --env.agent.harness.id null --env.agent.runtime.type subprocess
    agent.kwargs.env=<id> 'agent.kwargs.env_config={taskset: {count: 4},
        agent: {harness: {id: "null"}, runtime: {type: subprocess}}}'

``select`` is vf-eval's ``--select.*`` (``limit`` is ``-n``), ``sampling`` its
``--sampling.*``. Each run plays one task of the selected tasks
(``seed % len`` for ``agent.tasks=seeds``; a task row names one by ``idx`` or
``id``) as one episode of verifiers' own (``Env.run_slot``, as vf-eval runs
it). The model is cadence's endpoint: verifiers' interception server relays
every request of the harness program to this run's address (``client.base_url``),
where it is sampled and trained token for token. The reward is the episode's:
its trace's, or the mean over the trainable traces of a multi-agent episode.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
from collections.abc import Mapping
from typing import Any

from cadence.envs.hubs import HUBS, version_of

HUB = HUBS["verifiers"]
AS_AGENT = "agent.name=python:cadence.envs.hubs.verifiers:run agent.kwargs.env={}"
# The run is named by its address on the endpoint; the API key verifiers sends is
# read from this variable ("EMPTY" when unset), so no provider key of the
# environment (PRIME_API_KEY, the default) is sent to cadence.
API_KEY_VAR = "CADENCE_VERIFIERS_API_KEY"


def env_class(ident: str) -> type:
    """env.name=verifiers:<id> is not an environment: it says how a verifiers environment trains."""
    raise ValueError(
        f"env.name 'verifiers:{ident}': verifiers environments talk to an OpenAI client, so they "
        f"train as agents: drop env.name and set {AS_AGENT.format(ident)}"
    )


def one_line(text: str) -> str:
    """A message on one line: its first line, and its last where there are more (a traceback's cause)."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    return f"{lines[0]} ... {lines[-1]}"


def problems(exc: Any) -> str:
    """A pydantic ValidationError in one line: each field with what is wrong with it."""
    return one_line("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))


def _check_installed(env: str) -> None:
    from packaging.specifiers import SpecifierSet

    version = version_of(HUB)
    if version is None or (version != "installed" and version not in SpecifierSet(HUB.supported)):
        found = "not installed" if version is None else f"found verifiers {version}"
        raise ImportError(
            f"agent.kwargs.env={env!r} needs verifiers{HUB.supported} (its v1 API), {found}: {HUB.install}"
        )


def _uv_on_path() -> None:
    """verifiers prepares each harness program with uv, found on PATH. pip's `uv` (the extra
    installs it) lies beside the interpreter, on PATH only in an activated venv: as activating
    it would, put its folder first."""
    if shutil.which("uv"):
        return
    try:
        from uv import find_uv_bin
    except ImportError:
        return  # verifiers installs uv itself where it can (a container runtime does)
    os.environ["PATH"] = os.pathsep.join([os.path.dirname(find_uv_bin()), os.environ.get("PATH", "")])


def _null_ids(tree: Any, where: str) -> list[str]:
    """The `id` keys of `tree` that are null: YAML reads `id: null` (the null harness) as None."""
    if not isinstance(tree, Mapping):
        return []
    found = [f"{where}.id"] if "id" in tree and tree["id"] is None else []
    for key, value in tree.items():
        found += _null_ids(value, f"{where}.{key}")
    return found


@functools.cache
def _environment(env: str, env_config_json: str) -> Any:
    """The verifiers Env of taskset `env` with the [env] settings `env_config`, loaded once per process."""
    _check_installed(env)
    import verifiers.v1 as vf
    from pydantic import ValidationError

    config = json.loads(env_config_json)
    config["taskset"] = {**config.get("taskset", {}), "id": env}
    try:
        loaded = vf.load_environment(vf.resolve_env_config(config))
    except ValidationError as exc:
        raise ValueError(f"agent.kwargs.env_config of {env!r}: {problems(exc)}") from exc
    except (ModuleNotFoundError, AttributeError, TypeError, ValueError) as exc:
        # verifiers' own one-line plugin errors (an id that is not installed, a bad __all__)
        raise ValueError(f"agent.kwargs.env={env!r}: {one_line(str(exc))}") from exc
    _uv_on_path()
    return loaded


def environment(env: str, env_config: Mapping[str, Any] | None = None) -> Any:
    """The loaded Env (cached: its taskset and harnesses are built once per process)."""
    null = _null_ids(env_config, "agent.kwargs.env_config")
    if null:
        raise ValueError(
            f"{null[0]} is null: YAML reads null as nothing; for the null harness quote it, id: \"null\""
        )
    return _environment(env, json.dumps(dict(env_config or {}), sort_keys=True))


@functools.cache
def _tasks(env: str, env_config_json: str, select_json: str) -> tuple[Any, ...]:
    import verifiers.v1 as vf
    from pydantic import ValidationError

    try:
        select = vf.SelectConfig(**json.loads(select_json))
    except ValidationError as exc:
        raise ValueError(f"agent.kwargs.select: {problems(exc)}") from exc
    taskset = _environment(env, env_config_json).taskset.select(select)
    if not taskset.bounded:
        raise ValueError(
            f"agent.kwargs.env={env!r} is an infinite taskset: bound it with agent.kwargs.select.limit=N"
        )
    selected = tuple(taskset)
    if not selected:
        raise ValueError(f"agent.kwargs.select={select_json} leaves no task of {env!r}")
    return selected


def tasks(env: str, env_config: Mapping[str, Any] | None = None, select: Mapping[str, Any] | None = None) -> tuple:
    """The tasks runs play: the taskset's, through vf-eval's `--select.*` (`select`), in order."""
    environment(env, env_config)
    return _tasks(env, json.dumps(dict(env_config or {}), sort_keys=True), json.dumps(dict(select or {}), sort_keys=True))


def task_of(played: tuple, task: Any) -> Any:
    """The task a run plays: `seed % len` for a seed; for a task row, the task its `idx` or `id` names."""
    if isinstance(task, Mapping) and ("idx" in task or "id" in task):
        field = "idx" if "idx" in task else "id"
        for candidate in played:
            if getattr(candidate.data, field) == task[field]:
                return candidate
        raise ValueError(f"task row {dict(task)!r}: no task of the taskset has {field}={task[field]!r}")
    if isinstance(task, int) and not isinstance(task, bool):
        return played[task % len(played)]
    raise ValueError(
        f"task {task!r}: a verifiers environment plays agent.tasks=seeds (an integer), "
        "or task rows with an `idx` or `id` of the taskset's tasks"
    )


def episode_reward(env: str, episode: Any) -> float:
    """The episode's reward, or the one-line error of the rollout that failed inside verifiers."""
    if not episode.ok:  # verifiers keeps a failed rollout's errors on its episode instead of raising them
        errors = [*episode.errors, *(e for trace in episode.traces for e in trace.errors)]
        cause = errors[-1] if errors else None
        detail = f"{cause.type}: {one_line(cause.message)}" if cause else "the episode did not complete"
        raise RuntimeError(f"verifiers rollout of {env!r} failed: {detail}")
    trainable = [trace.reward for trace in episode.traces if trace.agent is None or trace.agent.trainable]
    if not trainable:
        raise RuntimeError(f"verifiers episode of {env!r} has no trainable trace to reward")
    return sum(trainable) / len(trainable)


async def run(
    client: Any,
    task: Any,
    env: str,
    env_config: dict[str, Any] | None = None,
    select: dict[str, Any] | None = None,
    model: str = "cadence",
    sampling: dict[str, Any] | None = None,
) -> float:
    """One episode of verifiers environment `env` on `task`, its model reached through `client`; its reward."""
    vf_env = environment(env, env_config)
    played = task_of(tasks(env, env_config, select), task)
    import verifiers.v1 as vf

    ctx = vf.ModelContext(
        model=model,
        client=vf.EvalClientConfig(base_url=str(client.base_url), api_key_var=API_KEY_VAR),
        sampling=vf.SamplingConfig(**(sampling or {})),
    )
    # serving() holds the episode's interception server and the taskset's shared tool servers
    # on the Env itself: each run serves its own shallow copy, so concurrent runs keep theirs
    # (and the interception's client for this run's address closes with it).
    run_env = copy.copy(vf_env)
    async with run_env.serving():
        episode = await run_env.run_slot(run_env.slots(played, 1)[0], ctx)
    return episode_reward(env, episode)
