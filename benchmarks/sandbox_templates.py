"""Templates (issue 26): cold start on a cached Debian template with a package the host lacks, and
forking a 100 MB workspace. Needs root, bubblewrap and (for the first build) mmdebstrap.

    python benchmarks/sandbox_templates.py [--n 20] [--store DIR]

Prints p50/p90 of each, with `uptime` before and after (the numbers move with the load).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from cadence.sandbox import Limits, LocalSandbox, workspace
from cadence.sandbox.templates import TemplateStore

LIMITS = Limits(file_size_mb=200, disk_mb=512, memory_mb=2048, wall_s=30)


def summary(xs: list[float]) -> str:
    return f"p50 {statistics.median(xs) * 1e3:.0f} ms, p90 {sorted(xs)[int(0.9 * len(xs)) - 1] * 1e3:.0f} ms (n={len(xs)})"


def cold_starts(template, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        box = LocalSandbox(LIMITS, template=template).start()
        out.append(time.perf_counter() - t0)
        box.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--store", default=None)
    args = ap.parse_args()
    print("load before:", os.popen("uptime").read().strip())
    t = TemplateStore(args.store).build_debian("bench-cowsay", ["cowsay"])  # cached after the first run
    with LocalSandbox(LIMITS, template=t) as box:
        assert "< moo >" in box.exec("/usr/games/cowsay moo").stdout and not os.path.exists("/usr/games/cowsay")
    print("cold start, no template:      ", summary(cold_starts(None, args.n)))
    print("cold start, Debian template:  ", summary(cold_starts(t, args.n)))
    with LocalSandbox(LIMITS, template=t) as box:
        box.exec("head -c 100000000 /dev/urandom > data.bin && mkdir src && for i in $(seq 100); do echo $i > src/f$i.py; done")
        forks, copies = [], []
        for _ in range(args.n):
            t0 = time.perf_counter()
            new = workspace.fork(box)
            forks.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            workspace.copy_workspace(box, new)  # into a sandbox already running (a warm spare)
            copies.append(time.perf_counter() - t0)
            assert new.exec("stat -c %s data.bin").stdout == "100000000\n"
            new.stop()
    print("fork 100 MB (start + copy):   ", summary(forks))
    print("copy 100 MB into a running one:", summary(copies))
    print("load after:", os.popen("uptime").read().strip())


if __name__ == "__main__":
    main()
