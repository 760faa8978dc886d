"""OpenEnv environments (``openenv-core``): a running server or an environment class.

    env.name=openenv:http://localhost:8000                     a server (Docker, HF Space, uvicorn)
    env.name=openenv:my_env.server.my_environment:MyEnvironment  the class, in this process

OpenEnv actions and observations are pydantic models. The response text (the
whole response: `action_tag = None`) becomes the action's text field: the one
string field the action requires (``message`` for the echo template, ``code``
for a coding env), or ``env.kwargs.action_field``. The observation's text is
its one string field, or ``env.kwargs.observation_field``, or else every field
as ``name: value`` lines; ``reward`` (None counts 0) and ``done``
(``terminated``) come with it, and ``reset`` gets the episode's seed.

Against a server every environment is a WebSocket session of its own (OpenEnv's
client, ``GenericEnvClient``): serve it with ``max_concurrent_envs`` at least
the episodes in flight (``rollout.prompts_per_step x rollout.group_size``, more
with async). An environment class is built with ``env.kwargs`` (less the two
field settings) and stepped in the runner's thread like any sync environment.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import typing
from typing import Any

from cadence.envs.contract import ResetReturn, StepReturn
from cadence.envs.hubs import bind_id
from cadence.python_spec import PYTHON_PREFIX, load_python_object

_NOT_TEXT = {"done", "reward", "metadata"}  # every OpenEnv observation has these


def text_field(schema: dict[str, Any], wanted: str | None) -> str:
    """The action field the response text goes into: `wanted`, or the action's one string field."""
    fields = schema.get("properties", {})
    if wanted is not None:
        if wanted not in fields:
            raise ValueError(f"env.kwargs.action_field: the action has no field {wanted!r}; it has {list(fields)}")
        return wanted
    strings = [name for name, spec in fields.items() if spec.get("type") == "string" and name not in _NOT_TEXT]
    required = [name for name in strings if name in schema.get("required", [])]
    choice = required or strings
    if len(choice) != 1:
        raise ValueError(
            f"env.kwargs.action_field: the action's fields are {list(fields)}; "
            "say which one the response text goes into, e.g. env.kwargs.action_field=message"
        )
    return choice[0]


def observation_text(observation: dict[str, Any], field: str | None) -> str:
    """An OpenEnv observation (as a dict) as the text the policy sees (see the module docstring)."""
    if field is not None:
        return str(observation.get(field, ""))
    shown = {name: value for name, value in observation.items() if name not in _NOT_TEXT}
    strings = [value for value in shown.values() if isinstance(value, str)]
    if len(strings) == 1:
        return strings[0]
    return "\n".join(
        f"{name}: {value if isinstance(value, str) else json.dumps(value, default=str)}"
        for name, value in shown.items()
    )


class OpenEnvServer:
    """An OpenEnv server at `base_url`, one WebSocket session per environment (async)."""

    action_tag = None
    base_url = ""

    def __init__(
        self,
        action_field: str | None = None,
        observation_field: str | None = None,
        message_timeout_s: float = 60.0,
    ) -> None:
        self.client_cls = _client_class()
        self.action_field = action_field
        self.observation_field = observation_field
        self.message_timeout_s = message_timeout_s
        self.field: str | None = None  # read from the server's /schema at the first reset
        self.client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _connected(self) -> Any:
        loop = asyncio.get_running_loop()
        if self.client is not None and self._loop is loop:
            return self.client
        if self.field is None:
            import httpx

            async with httpx.AsyncClient(timeout=self.message_timeout_s) as http:
                reply = await http.get(f"{self.base_url.rstrip('/')}/schema")
                reply.raise_for_status()
            self.field = text_field(reply.json()["action"], self.action_field)
        # A WebSocket belongs to the loop that opened it: a new loop gets a new session.
        self.client = self.client_cls(base_url=self.base_url, message_timeout_s=self.message_timeout_s)
        await self.client.connect()
        self._loop = loop
        return self.client

    async def reset(self, seed: int) -> ResetReturn:
        from websockets.exceptions import ConnectionClosed

        try:
            result = await (await self._connected()).reset(seed=seed)
        except ConnectionClosed as exc:  # what a server at its max_concurrent_envs does to one more
            self.client = None
            raise ConnectionError(
                f"the OpenEnv server at {self.base_url} closed the session ({exc}); a server takes at "
                "most max_concurrent_envs sessions: serve it with at least the episodes in flight "
                "(rollout.prompts_per_step x rollout.group_size, more with rollout.async_ratio)"
            ) from exc
        return observation_text(result.observation, self.observation_field), {}

    async def step(self, action: str) -> StepReturn:
        result = await (await self._connected()).step({self.field: action})
        text = observation_text(result.observation, self.observation_field)
        return text, float(result.reward or 0.0), bool(result.done), False, {}

    async def close(self) -> None:
        if self.client is not None and self._loop is asyncio.get_running_loop():
            await self.client.close()
        self.client = None


def _client_class() -> type:
    # openenv.core imports gradio (seconds): imported when the config loads, never on the event
    # loop, where it would stall every episode in flight past its step timeout.
    from openenv.core.generic_client import GenericEnvClient

    return GenericEnvClient


def action_class(env_cls: type) -> type:
    """The Action model an OpenEnv Environment class steps with: step()'s annotation, else the
    class's Environment[Action, ...] parameters."""
    from openenv.core.env_server.types import Action

    candidates = []
    try:
        candidates.append(typing.get_type_hints(env_cls.step).get("action"))
    except Exception:  # noqa: S110 - an annotation that does not resolve: try the generic parameters
        pass
    for base in getattr(env_cls, "__orig_bases__", ()):
        candidates.extend(typing.get_args(base)[:1])
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, Action) and candidate is not Action:
            return candidate
    raise ValueError(
        f"{env_cls.__name__}: cannot tell its Action class; annotate step(self, action: MyAction)"
    )


def _accepted(fn: Any, **kwargs: Any) -> dict[str, Any]:
    """The kwargs `fn` takes (an OpenEnv reset may take seed, or nothing)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return kwargs
    names = {p.name for p in params}
    return {key: value for key, value in kwargs.items() if key in names}


class OpenEnvLocal:
    """An OpenEnv Environment class built in this process (sync, in the runner's thread)."""

    action_tag = None
    spec = ""

    @classmethod
    def check_config(cls, action_field: str | None = None, **_: Any) -> None:
        """Config-time check (nothing is built): the action field exists or can be told."""
        text_field(action_class(_load_environment_class(cls.spec)).model_json_schema(), action_field)

    def __init__(self, action_field: str | None = None, observation_field: str | None = None, **kwargs: Any):
        env_cls = _load_environment_class(self.spec)
        self.env = env_cls(**kwargs)
        self.action_cls = action_class(env_cls)
        self.field = text_field(self.action_cls.model_json_schema(), action_field)
        self.observation_field = observation_field

    def _text(self, observation: Any) -> str:
        return observation_text(observation.model_dump(), self.observation_field)

    def reset(self, seed: int) -> ResetReturn:
        observation = self.env.reset(**_accepted(self.env.reset, seed=seed))
        return self._text(observation), {}

    def step(self, action: str) -> StepReturn:
        observation = self.env.step(self.action_cls(**{self.field: action}))
        reward = float(observation.reward or 0.0)
        return self._text(observation), reward, bool(observation.done), False, dict(observation.metadata or {})

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


def _load_environment_class(spec: str) -> type:
    from openenv.core.env_server.interfaces import Environment

    where = f"env.name 'openenv:{spec}'"
    env_cls = load_python_object(f"{PYTHON_PREFIX}{spec}", where, kind="class")
    if not (isinstance(env_cls, type) and issubclass(env_cls, Environment)):
        raise ValueError(f"{where}: {env_cls!r} is not an OpenEnv Environment class")
    return env_cls


@functools.cache
def env_class(ident: str) -> type:
    """The environment class of ``openenv:<url>`` or ``openenv:<module:Class>``; ValueError if unusable."""
    if ident.startswith(("http://", "https://")):
        _client_class()
        return bind_id(OpenEnvServer, "base_url", ident)
    if ":" not in ident:
        raise ValueError(
            f"env.name 'openenv:{ident}': expected a server address (openenv:http://HOST:PORT) "
            "or an Environment class (openenv:module:Class, openenv:/path/file.py:Class)"
        )
    env_cls = _load_environment_class(ident)  # its errors name env.name already
    try:
        action_class(env_cls)
    except ValueError as exc:
        raise ValueError(f"env.name 'openenv:{ident}': {exc}") from None
    return bind_id(OpenEnvLocal, "spec", ident)
