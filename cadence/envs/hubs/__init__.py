"""Environments from the hubs people use, by name: ``env.name=<hub>:<id>``.

    env.name=gem:game:GuessTheNumber-v0-easy        GEM (pip install 'cadence[envs-gem]')
    env.name=skyrl:gsm8k env.kwargs.data=rows.jsonl skyrl-gym (pip install 'cadence[envs-skyrl]')
    env.name=openenv:http://localhost:8000          an OpenEnv server (pip install 'cadence[envs-openenv]')
    env.name=openenv:my_env.server:MyEnvironment    an OpenEnv environment class, in process

verifiers environments talk to an OpenAI client, so they train as agents:
``agent.name=python:cadence.envs.hubs.verifiers:run agent.kwargs.env=<taskset id>``
(``env.name=verifiers:<id>`` says so).

Each hub module has ``env_class(ident) -> type``: a class of the text contract
(`cadence.envs.contract`) bound to that id, built with ``env.kwargs``. The id is
checked when the config loads (one line naming env.name, the closest ids, and
the extra to install when the hub's package is missing), before any model loads.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Hub:
    """One environment hub: where its adapter lives and what to install for it."""

    module: str  # the adapter: cadence.envs.hubs.<hub>
    package: str  # the import name of the hub's own package
    distribution: str  # its name on PyPI
    extra: str  # cadence's optional extra that installs it
    example: str  # a setting that works once it is installed
    what: str
    supported: str = ""  # the versions the adapter works with (a PEP 440 specifier), "" for any

    @property
    def install(self) -> str:
        return f"pip install 'cadence[{self.extra}]'"


HUBS: dict[str, Hub] = {
    "gem": Hub(
        "cadence.envs.hubs.gem", "gem", "gem-llm", "envs-gem", "env.name=gem:game:GuessTheNumber-v0-easy",
        "GEM environments (games, math, code, QA, reasoning-gym): gem:<GEM id>",
    ),
    "skyrl": Hub(
        "cadence.envs.hubs.skyrl", "skyrl_gym", "skyrl-gym", "envs-skyrl",
        "env.name=skyrl:gsm8k env.kwargs.data=FILE",
        "skyrl-gym environments on a dataset of SkyRL rows: skyrl:<id> env.kwargs.data=FILE",
    ),
    "openenv": Hub(
        "cadence.envs.hubs.openenv", "openenv", "openenv-core", "envs-openenv",
        "env.name=openenv:http://localhost:8000",
        "OpenEnv environments: a running server (openenv:http://HOST:PORT) or a class "
        "(openenv:module:Class)",
    ),
    "verifiers": Hub(
        "cadence.envs.hubs.verifiers", "verifiers", "verifiers", "envs-verifiers",
        "agent.name=python:cadence.envs.hubs.verifiers:run agent.kwargs.env=ID",
        "verifiers environments (the Environments Hub), trained as agents through the endpoint",
        supported=">=0.4,<0.5",  # its v1 API (0.3.x's classic API is not supported)
    ),
}


def hub_of(name: str) -> Hub | None:
    """The hub an env name starts with (``gem:...``), or None."""
    prefix, sep, _ = name.partition(":")
    return HUBS.get(prefix) if sep else None


def version_of(hub: Hub) -> str | None:
    """The installed version of the hub's package, or None when it is not installed."""
    if importlib.util.find_spec(hub.package) is None:
        return None
    try:
        return importlib.metadata.version(hub.distribution)
    except importlib.metadata.PackageNotFoundError:
        return "installed"


def install_state(hub: Hub) -> str:
    """What `cadence envs` says of a hub: its version, or what to install."""
    from packaging.specifiers import SpecifierSet

    version = version_of(hub)
    if version is None:
        return f"not installed: {hub.install}"
    if not hub.supported or version == "installed" or version in SpecifierSet(hub.supported):
        return f"{hub.distribution} {version}"
    return f"{hub.distribution} {version}, but this adapter needs {hub.distribution}{hub.supported}: {hub.install}"


def resolve_hub_env(name: str) -> type:
    """The class `name` (``<hub>:<id>``) stands for; ValueError in one line when it is not usable."""
    hub = hub_of(name)
    assert hub is not None, name
    ident = name.partition(":")[2]
    if version_of(hub) is None:
        raise ValueError(f"env.name {name!r} needs {hub.distribution}, not installed: {hub.install}")
    if not ident:
        raise ValueError(f"env.name {name!r} names no environment; e.g. {hub.example}")
    return importlib.import_module(hub.module).env_class(ident)


def unknown_id(name: str, ident: str, known: Iterable[str], listing: str) -> ValueError:
    """The one-line error for an id a hub does not have: the closest ids, and where to see them all."""
    known = list(known)
    close = difflib.get_close_matches(ident, known, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return ValueError(f"env.name {name!r}: no environment {ident!r}{hint} ({len(known)} known; {listing})")


def bind_id(base: type, attr: str, ident: str) -> type:
    """A subclass of `base` whose `attr` is `ident`: the class the env name stands for, built with
    env.kwargs alone (as every environment class is, in a thread or a child process)."""
    return type(f"{base.__name__}[{ident}]", (base,), {attr: ident, "__module__": base.__module__})
