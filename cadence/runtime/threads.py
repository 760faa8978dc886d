"""torch thread counts per process.

On these small machines thread oversubscription is the first performance bug
(a small matmul ran 27x slower with two busy processes each asking for two
threads), so every process sets its own count from its share of the cores.
"""

from __future__ import annotations

import os

import torch


def cpu_share(processes: int = 1) -> int:
    """Cores available to this process when `processes` share the machine."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // max(1, processes))


def configure_threads(threads: int = 0, processes: int = 1) -> int:
    """Set torch's intra-op threads (0 = this process's share); returns the count."""
    n = threads or cpu_share(processes)
    torch.set_num_threads(n)
    return n
