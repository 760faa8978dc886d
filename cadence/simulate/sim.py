"""One simulated run of either kind: RLVR (cluster.py) or agentic (agentic.py), as the config says."""

from __future__ import annotations

from cadence.simulate.agentic import AgenticSim
from cadence.simulate.cluster import ClusterSim, SimResult
from cadence.simulate.config import SimConfig


def simulate(cfg: SimConfig) -> SimResult:
    """One run: an RLVR one, or an agentic one when `cfg.env` is set."""
    if cfg.env is not None:
        return AgenticSim(cfg).run()
    return ClusterSim(cfg).run()
