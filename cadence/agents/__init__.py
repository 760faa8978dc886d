"""Agents written as programs: an OpenAI-compatible endpoint over the inference hub, and the
token-exact trajectories it records from their requests (see endpoint.py, trajectory.py)."""

from cadence.agents.endpoint import AgentEndpoint
from cadence.agents.trajectory import Trajectory

__all__ = ["AgentEndpoint", "Trajectory"]
