"""`AgentConfig`: which agent program an agent run trains, on which tasks, through which endpoint.

    agent.name=python:my_agents:run          (or python:path/to/file.py:run)
    agent.kwargs.model=cadence               (extra keyword arguments of run)
    agent.tasks=task                         (rows of the task.* dataset; 'seeds': integers)

The agent is `async def run(client, task, **kwargs) -> float | dict`: `client`
an `openai.AsyncOpenAI` pointed at this run's address on the endpoint, `task`
a row of the dataset (a dict: the JSONL record, or {prompt, answer} of a
generated task) or an integer seed. Everything here is checked when the config
loads (the agent's module is imported, its signature bound to the kwargs),
before any model loads.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cadence.python_spec import PYTHON_PREFIX, check_known_kwargs, load_python_object

# The config's names for the endpoint's tool-call formats (cadence.agents.tool_calls).
TOOL_FORMAT_NAMES = {"hermes": "hermes", "llama3": "llama3_json", "none": None}


class AgentEndpointConfig(BaseModel):
    """The OpenAI-compatible endpoint the agent talks to during rollout."""

    model_config = ConfigDict(extra="forbid")

    tool_format: Literal["auto", "hermes", "llama3", "none"] = Field(
        "auto", description="How tool calls in the model's output are parsed into OpenAI tool_calls: "
        "'hermes' (<tool_call>{json}</tool_call>, Qwen), 'llama3' (a JSON reply), 'none' (plain text), "
        "'auto' (from the tokenizer's chat template).",
    )
    max_context_tokens: int | None = Field(
        None, gt=0, description="A request whose prompt + max_tokens exceeds this is refused (HTTP 400, "
        "the agent sees why). None: rollout.max_context_tokens, capped at the model's max_position_embeddings.",
    )
    model_name: str = Field("cadence", min_length=1, description="The model id /v1/models lists.")


class AgentConfig(BaseModel):
    """An agent program trained through the endpoint (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        description="The agent: 'python:module:function' or 'python:/path/file.py:function', an "
        "`async def run(client, task)` returning its reward (a number, or a dict with 'reward').",
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Extra keyword arguments for every call of the agent."
    )
    tasks: Literal["task", "seeds"] = Field(
        "task", description="What `task` is: 'task' a row of the task.* dataset (train split for "
        "training, test split for evaluation); 'seeds' an integer (held-out seeds for evaluation).",
    )
    timeout_s: float = Field(
        600.0, gt=0, description="Seconds one agent run may take; past it the run is lost (counted) and retried.",
    )
    max_retries: int | None = Field(
        None, ge=0, description="Lost runs replaced per group (on the same task); None: 2 x rollout.group_size.",
    )
    endpoint: AgentEndpointConfig = Field(default_factory=AgentEndpointConfig)

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        resolve_agent(name)  # raises ValueError saying why it is not an agent
        return name

    @model_validator(mode="after")
    def _check_kwargs(self) -> AgentConfig:
        signature = _signature(resolve_agent(self.name))
        if signature is None:
            return self
        params = signature.parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            accepted = [p for p in params if p not in ("client", "task")]
            check_known_kwargs(self.kwargs, accepted, "agent.kwargs", "the agent")
        try:
            signature.bind("client", "task", **self.kwargs)
        except TypeError as exc:
            raise ValueError(f"agent.kwargs: {self.name}{signature}: {exc}") from None
        return self

    @property
    def tool_format(self) -> str | None:
        """The endpoint's tool_format argument."""
        return "auto" if self.endpoint.tool_format == "auto" else TOOL_FORMAT_NAMES[self.endpoint.tool_format]


def resolve_agent(name: str) -> Callable:
    """The agent function `agent.name` names; ValueError in one line when it is not usable."""
    if not name.startswith(PYTHON_PREFIX):
        raise ValueError(
            f"agent.name {name!r} must be 'python:module:function' or 'python:/path/file.py:function' "
            "naming an `async def run(client, task)`"
        )
    where = f"agent.name {name!r}"
    agent = load_python_object(name, where, kind="function")
    if not callable(agent):
        raise ValueError(f"{where} is a {type(agent).__name__}, not a function: name an `async def run(client, task)`")
    if not inspect.iscoroutinefunction(agent):
        raise ValueError(
            f"{where} is not an async function: define it as `async def {name.rpartition(':')[2]}(client, task)` "
            "(it awaits the client's requests)"
        )
    signature = _signature(agent)
    if signature is not None:
        try:
            signature.bind("client", "task")
        except TypeError:
            params = list(signature.parameters)
            # Missing kwargs are reported against agent.kwargs; too few positions are the contract's.
            positional = [p for p in signature.parameters.values()
                          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
            if len(positional) < 2 and not any(p.kind is p.VAR_POSITIONAL for p in positional):
                raise ValueError(
                    f"{where} takes {params}: an agent is called as run(client, task, **agent.kwargs)"
                ) from None
    return agent


def _signature(agent: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(agent)
    except (TypeError, ValueError):
        return None  # no introspectable signature: trust the call
