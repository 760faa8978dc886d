"""Agents written as programs: an OpenAI-compatible endpoint over the inference hub, and the
token-exact trajectories it records from their requests (see endpoint.py, trajectory.py).

The names load on first use: `cadence.agents.config` is read with every run config, and must
not pull in the web server and the engine types."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cadence.agents.endpoint import AgentEndpoint
    from cadence.agents.trajectory import Trajectory

__all__ = ["AgentEndpoint", "Trajectory"]


def __getattr__(name: str):
    if name == "AgentEndpoint":
        from cadence.agents.endpoint import AgentEndpoint

        return AgentEndpoint
    if name == "Trajectory":
        from cadence.agents.trajectory import Trajectory

        return Trajectory
    raise AttributeError(f"module 'cadence.agents' has no attribute {name!r}")
