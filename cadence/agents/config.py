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
import os
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cadence.python_spec import PYTHON_PREFIX, check_known_kwargs, load_python_object
from cadence.sandbox.models import Limits

# The config's names for the endpoint's tool-call formats (cadence.agents.tool_calls).
BUILTIN_CANARIES = "builtin:repo_bugs"  # the canaries of the built-in repository tasks
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
    max_n: int = Field(16, ge=1, description="Choices one request may ask for (`n`); more is refused (HTTP 400).")
    max_tokens_limit: int | None = Field(
        None, gt=0, description="The largest max_tokens a request may ask for (more: HTTP 400). None: the "
        "context budget (max_context_tokens).",
    )
    max_body_mb: int = Field(8, ge=1, description="A request body over this many MiB is refused (HTTP 413).")


class TaskSandboxConfig(BaseModel):
    """`agent.sandbox`: the sandbox each run gets, from a pool with warm spares (cadence/agents/task_sandbox.py)."""

    model_config = ConfigDict(extra="forbid")

    template: str | None = Field(
        None, description="The template (cadence sandbox template build) the sandboxes run on; a row's "
        "'template' field overrides it. None: the host's system, read-only.",
    )
    limits: Limits = Field(default_factory=Limits, description="Per-sandbox limits (memory_mb, wall_s per call, ...).")
    warm: int = Field(4, ge=0, le=1024, description="Warm spares kept ready on the template.")
    max_size: int = Field(256, ge=1, le=65536, description="Sandboxes leased at once at most (runs, groups' "
                          "prepared states and gradings together); an acquire past it waits.")
    repo_field: str = Field("repo", description="Row field with the workspace: a folder or a .tar path.")
    files_field: str = Field("files", description="Row field with files for the workspace: {path: text}.")
    setup: str | None = Field(
        None, description="A shell command run once per group in the prepared workspace (e.g. 'pip install "
        "-e .'); every run of the group starts from a copy of its result.",
    )
    setup_timeout_s: float = Field(300.0, gt=0, le=86400, description="Wall clock of the setup command.")
    http: bool = Field(
        True, description="Also serve each run's sandbox over HTTP (task['sandbox_url'], a token scoped to "
        "that sandbox in task['sandbox_token']), for scaffolds in another process or language.",
    )


class GraderConfig(BaseModel):
    """`agent.grader`: a run's reward from the task's hidden tests (cadence/agents/grader.py)."""

    model_config = ConfigDict(extra="forbid")

    tests_field: str = Field("tests", description="Row field with the hidden tests: snippets in the "
                             "unit-test judge's format, never shown to the agent.")
    setup_field: str = Field("test_setup", description="Row field with code the judge's worker runs before "
                             "each test, from the workspace (e.g. 'from calc import add').")
    protected_field: str = Field("protected", description="Row field with the task's protected paths (added "
                                 "to agent.grader.protected).")
    protected: list[str] = Field(
        default_factory=lambda: ["tests", "test", "conftest.py", "pytest.ini", "tox.ini", "setup.cfg",
                                 "pyproject.toml", "*.pth", "sitecustomize.py", "usercustomize.py"],
        description="Paths whose changes are not carried to grading (graded as the task had them), "
        "as in .gitignore: a name without '/' matches at any depth, one with '/' from the workspace root; "
        "a folder covers what is under it.",
    )
    outputs: list[str] | None = Field(
        None, description="Carry only these paths (same patterns) from the run's workspace; None: every change.",
    )
    scoring: str = Field(
        "fraction", description="'fraction' (tests passed / total), 'all' (1.0 only if all pass), or "
        "'python:module:function' taking the report {passed, total, error} and returning the reward.",
    )
    agent_reward: Literal["ignore", "add"] = Field(
        "ignore", description="The agent's own returned number: 'ignore' (logged as agent/returned_reward_mean "
        "only) or 'add' (added to the grader's).",
    )
    test_timeout_s: float = Field(2.0, gt=0, le=3600, description="Wall clock per hidden test; one out of "
                                  "time scores the run 0.")
    max_changes_mb: float = Field(16.0, gt=0, le=4096, description="A run whose changed files pass this "
                                  "size scores 0 (nothing is graded).")

    @field_validator("scoring")
    @classmethod
    def _check_scoring(cls, scoring: str) -> str:
        if scoring in ("fraction", "all"):
            return scoring
        if not scoring.startswith(PYTHON_PREFIX):
            raise ValueError(f"agent.grader.scoring {scoring!r}: 'fraction', 'all', or 'python:module:function'")
        if not callable(load_python_object(scoring, f"agent.grader.scoring {scoring!r}", kind="function")):
            raise ValueError(f"agent.grader.scoring {scoring!r} is not a function of the test report")
        return scoring


class CanariesConfig(BaseModel):
    """`agent.canaries`: tasks that cannot pass honestly; their pass rate is the measured hack rate."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="A JSONL file of canary rows (the task rows' fields; hidden tests that "
                      "contradict the statement), or 'builtin:repo_bugs' (cadence/data/repo_bugs.py).")
    every: int = Field(8, ge=2, description="One group in `every` plays a canary.")
    max_pass_rate: float = Field(0.05, ge=0, le=1, description="Above this pass rate (over the last `window` "
                                 "canary runs) the run warns or stops.")
    window: int = Field(32, ge=1, description="Canary runs the threshold looks at (none before that many).")
    action: Literal["warn", "stop"] = Field("warn", description="'warn': print a warning; 'stop': end the run.")

    @field_validator("path")
    @classmethod
    def _check_path(cls, path: str) -> str:
        if path == BUILTIN_CANARIES:
            return path
        if not os.path.isfile(path):
            raise ValueError(f"agent.canaries.path {path!r}: no such file (a JSONL of canary task rows)")
        return path


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
    sandbox: TaskSandboxConfig | None = Field(
        None, description="A sandbox per run with the task's workspace, handed to the agent with the task "
        "(task['sandbox'], task['sandbox_url'], task['sandbox_token']); None: no sandbox.",
    )
    grader: GraderConfig | None = Field(
        None, description="Grade each run's workspace changes with the task's hidden tests, in a fresh copy "
        "of the task's start the agent never touched; None: the agent's own return is the reward.",
    )
    canaries: CanariesConfig | None = Field(
        None, description="Tasks whose hidden tests cannot pass honestly, mixed in to measure the hack rate.",
    )

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

    @model_validator(mode="after")
    def _check_grading(self) -> AgentConfig:
        if (self.sandbox is not None or self.grader is not None) and self.tasks != "task":
            raise ValueError("agent.sandbox and agent.grader need agent.tasks=task (rows with a workspace)")
        if self.grader is not None and self.sandbox is None:
            raise ValueError("agent.grader grades the run's sandbox: set agent.sandbox too (e.g. agent.sandbox.warm=4)")
        if self.canaries is not None and self.grader is None:
            raise ValueError("agent.canaries are scored by the grader: set agent.grader too")
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
