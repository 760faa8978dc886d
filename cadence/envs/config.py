"""`EnvConfig`: which environment an agentic run plays, and how its episodes are run.

Environment names:

* a built-in (``cadence envs`` lists them): ``frozenlake``, ``sokoban``, ``code``,
  ``gymnasium`` (any gymnasium id), ``textarena`` (any TextArena game, optional extra);
* a hub's environment, ``<hub>:<id>`` (`cadence.envs.hubs`): ``gem:game:GuessTheNumber-v0-easy``,
  ``skyrl:gsm8k``, ``openenv:http://HOST:PORT`` (each an optional extra);
* ``python:pkg.module:Class`` or ``python:/path/to/file.py:Class``: a class with
  ``reset(seed)`` and ``step(action)`` (see `cadence.envs.contract`), built with
  ``env.kwargs``; checked (imported, signature-checked) at load time.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cadence.python_spec import PYTHON_PREFIX, check_known_kwargs


class LatencyConfig(BaseModel):
    """Simulated environment latency (ROLL Flash's stress test): off while every value is 0."""

    model_config = ConfigDict(extra="forbid")

    mean_s: float = Field(0.0, ge=0, description="Mean delay added to every step, in seconds.")
    std_s: float = Field(
        0.0, ge=0, description="Standard deviation of the delay (normal, clipped at 0)."
    )
    fail_slow_share: float = Field(
        0.0, ge=0, le=1, description="Share of steps that are fail-slow: delay x fail_slow_factor."
    )
    fail_slow_factor: float = Field(
        10.0, ge=1, description="How many times slower a fail-slow step is."
    )
    fail_stop_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of steps that never answer (the step timeout ends the episode).",
    )
    seed: int = Field(0, description="Seed of the latency draws (mixed with each episode's seed).")

    @property
    def enabled(self) -> bool:
        return bool(self.mean_s or self.std_s or self.fail_slow_share or self.fail_stop_share)

    @model_validator(mode="after")
    def _check_shares(self) -> LatencyConfig:
        if self.fail_slow_share + self.fail_stop_share > 1:
            raise ValueError(
                "latency.fail_slow_share + latency.fail_stop_share must be at most 1, got "
                f"{self.fail_slow_share} + {self.fail_stop_share}"
            )
        return self


class EnvConfig(BaseModel):
    """The environment of an agentic run and the rules of its episodes."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        "frozenlake",
        description="A built-in environment ('cadence envs' lists them), a hub's environment "
        "('gem:ID', 'skyrl:ID', 'openenv:URL|module:Class') or "
        "'python:module:Class' / 'python:/path/file.py:Class'.",
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments for the environment's constructor, e.g. env.kwargs.size=6.",
    )
    max_turns: int = Field(
        8, ge=1, description="Policy turns per episode; the episode is truncated after the last."
    )
    step_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Seconds one reset() or step() may take; past it the episode fails (counted) "
        "and the environment is replaced.",
    )
    action_tag: str | None = Field(
        "auto",
        description="The tag actions come in: 'answer' passes the text inside the response's "
        "last <answer>...</answer> to step(); null passes the whole response; 'auto' takes the "
        "environment's own action_tag (built-ins), else 'answer'.",
    )
    format_penalty: float = Field(
        0.1,
        ge=0,
        description="Subtracted from a turn's reward when the response has no action tag; the "
        "environment is not stepped and the policy is told the format.",
    )
    isolation: Literal["thread", "process"] = Field(
        "thread",
        description="'thread': the environment runs in a thread of this process; 'process': in "
        "a child process of its own, so a crash (segfault, exit) fails one episode ('died') "
        "and a hung step is killed.",
    )
    latency: LatencyConfig = Field(
        default_factory=LatencyConfig,
        description="Simulated per-step latency, fail-slow and fail-stop (any environment).",
    )
    turn_format: Literal["auto", "plain", "chat"] = Field(
        "auto",
        description="How observations and the model's turns become tokens: 'chat' renders the "
        "tokenizer's chat template (observations as user messages), 'plain' puts each observation "
        "between newlines (the built-in model), 'auto' is chat when the tokenizer has a template.",
    )
    system_prompt: str | None = Field(
        None,
        description="Text before the first observation: a system message under the chat format, "
        "a first line under the plain one. None: nothing.",
    )

    @field_validator("action_tag")
    @classmethod
    def _check_tag(cls, tag: str | None) -> str | None:
        if tag is not None and not tag.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"env.action_tag {tag!r} must be a plain tag name such as 'answer'")
        return tag

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        from cadence.envs.hubs import HUBS, hub_of
        from cadence.envs.registry import BUILTIN_ENVS, resolve_env_class

        if name in BUILTIN_ENVS:
            return name
        if name.startswith(PYTHON_PREFIX) or hub_of(name) is not None:
            resolve_env_class(name)  # raises ValueError saying why it is not an environment
            return name
        close = difflib.get_close_matches(name, list(BUILTIN_ENVS), n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"env.name {name!r} is unknown{hint} Built-ins: {', '.join(BUILTIN_ENVS)}; "
            f"hubs: {', '.join(f'{hub}:ID' for hub in HUBS)}; "
            "or 'python:module:Class' / 'python:/path/file.py:Class'"
        )

    @model_validator(mode="after")
    def _check_kwargs(self) -> EnvConfig:
        from cadence.envs.registry import resolve_env_class

        cls = resolve_env_class(self.name)
        self._check_arguments(cls)
        check = getattr(cls, "check_config", None)
        if callable(check):
            check(**self.kwargs)  # ValueError: a missing extra, an unknown game id, ...
        return self

    def _check_arguments(self, cls: type) -> None:
        """env.kwargs against the constructor's signature: unknown keys (with the closest), missing ones."""
        try:
            signature = inspect.signature(cls)
        except (TypeError, ValueError):
            return  # no introspectable constructor: trust the kwargs
        params = signature.parameters.values()
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            accepted = [p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL]
            check_known_kwargs(self.kwargs, accepted, "env.kwargs", cls.__name__)
        try:
            signature.bind(**self.kwargs)
        except TypeError as exc:
            raise ValueError(f"env.kwargs: {cls.__name__}: {exc}") from None
