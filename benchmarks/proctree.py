"""Peak memory of a process tree: run a command and poll the RSS/PSS of it and all its descendants.

Used by benchmarks/vs_trl.py, where a run is a subprocess whose descendants
(Ray's gcs/raylet/workers, reward workers) count too. Needs psutil (the
`bench-trl` extra).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil


@dataclass
class MemorySample:
    """One poll of a process tree: wall time (time.time()), summed RSS and PSS in bytes."""

    t: float
    rss: int
    pss: int | None
    processes: int


@dataclass
class SampledRun:
    """What `run_sampled` saw of one subprocess."""

    returncode: int
    wall_s: float
    started: float  # time.time() at spawn
    samples: list[MemorySample] = field(default_factory=list)
    timed_out: bool = False

    @property
    def peak_rss(self) -> int:
        return max((s.rss for s in self.samples), default=0)

    @property
    def peak_pss(self) -> int | None:
        values = [s.pss for s in self.samples if s.pss is not None]
        return max(values) if values else None

    @property
    def max_processes(self) -> int:
        return max((s.processes for s in self.samples), default=0)

    def peak_rss_between(self, start: float, end: float) -> int:
        """Peak tree RSS among the samples taken in [start, end] (time.time() values)."""
        return max((s.rss for s in self.samples if start <= s.t <= end), default=0)


def tree_memory(pid: int, pss: bool = False) -> tuple[int, int | None, int]:
    """(summed RSS, summed PSS or None, process count) of `pid` and all its descendants.

    RSS counts a page shared by several processes (libraries, fork copy-on-write,
    Ray's object store) once per process, so the sum over-states a tree of many
    processes; PSS splits shared pages between their sharers and does not.
    Processes that exit between the listing and the read are skipped.
    """
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0, None, 0
    rss, pss_total, alive = 0, 0 if pss else None, 0
    for p in procs:
        try:
            if pss:
                info = p.memory_full_info()
                pss_total += info.pss  # type: ignore[operator]
                rss += info.rss
            else:
                rss += p.memory_info().rss
            alive += 1
        except psutil.Error:
            continue
    return rss, pss_total, alive


def run_sampled(
    cmd: Sequence[str],
    env: dict[str, str] | None = None,
    log_path: Path | None = None,
    interval: float = 0.2,
    pss_every: int = 10,
    timeout: float | None = None,
) -> SampledRun:
    """Run `cmd` to completion, polling its process tree's memory every `interval` s.

    PSS (slower to read: it walks each process's page tables) is taken every
    `pss_every`-th poll. On `timeout` the whole tree is killed.
    """
    log = open(log_path, "w") if log_path is not None else subprocess.DEVNULL
    started = time.time()
    t0 = time.perf_counter()
    proc = subprocess.Popen(list(cmd), env=env, stdout=log, stderr=subprocess.STDOUT)
    out = SampledRun(returncode=-1, wall_s=0.0, started=started)
    polls = 0
    try:
        while proc.poll() is None:
            rss, pss, n = tree_memory(proc.pid, pss=pss_every > 0 and polls % pss_every == 0)
            if n:
                out.samples.append(MemorySample(time.time(), rss, pss, n))
            polls += 1
            if timeout is not None and time.perf_counter() - t0 > timeout:
                out.timed_out = True
                kill_tree(proc.pid)
                break
            time.sleep(interval)
        out.returncode = proc.wait()
    finally:
        out.wall_s = time.perf_counter() - t0
        if log_path is not None:
            log.close()  # type: ignore[union-attr]
    return out


def kill_tree(pid: int) -> None:
    """Kill `pid` and its descendants (only the tree this script started)."""
    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.Error:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
