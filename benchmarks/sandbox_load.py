"""Sandbox service numbers: cold start, warm acquire, and a held exec load.

    python benchmarks/sandbox_load.py --out docs/results/sandbox_load.json --doc docs/sandbox.md
                                                 # 100 exec/s for 60 s (about 70 s in all)
    python benchmarks/sandbox_load.py --quick    # smoke: 20 exec/s for 5 s

Measures, on this machine:
  cold start    LocalSandbox.start(): bwrap + Python up + agent ready to run code (sequential);
                beside it, alternated, the same with /usr/bin/python3 and no site-packages
  warm acquire  Pool.acquire() of a ready spare, in process; and POST /v1/sandboxes over HTTP
  exec load     open-loop `rate` exec calls/s of a small Python snippet against one service
                (`sandboxes` leased sandboxes, round-robin), latency per call, errors counted
  workspace     (root only) fork (start a sandbox + copy), copy into a running sandbox, and
                snapshot, of a workspace of 200 small files and 20 MB
Prints a table, and writes the numbers to --out (JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

from cadence.observe.report import write_doc_table
from cadence.sandbox import Limits, LocalSandbox, workspace
from cadence.sandbox.pool import Pool, PoolConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tests.sandbox.service
from tests.sandbox.service import running_service  # noqa: E402

SNIPPET = "print(sum(i * i for i in range(1000)))"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def ms(xs: list[float]) -> dict:
    return {"n": len(xs), "p50_ms": pct(xs, 50) * 1e3, "p90_ms": pct(xs, 90) * 1e3,
            "p99_ms": pct(xs, 99) * 1e3, "max_ms": max(xs) * 1e3}


# The sandbox Python before it was the host's own (as root with a pyenv under /root):
SYSTEM_PYTHON = {"python": "/usr/bin/python3", "python_packages": "none"}


def cold_starts(n: int, variants: dict[str, dict]) -> dict:
    """`n` sequential starts of each variant (LocalSandbox keyword arguments), alternated, so a
    change in the machine's load hits them alike."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(n):
        for name, kw in variants.items():
            sb = LocalSandbox(Limits(), **kw)
            t0 = time.perf_counter()
            sb.start()
            times[name].append(time.perf_counter() - t0)
            assert sb.exec(code="print(1)").stdout == "1\n"
            sb.stop()
    return {name: ms(t) for name, t in times.items()}


def warm_acquires_in_process(n: int) -> dict:
    times = []
    with Pool(PoolConfig(warm=4, health_period_s=3600)) as pool:
        for _ in range(n):
            deadline = time.monotonic() + 30
            while pool.counts()["ready"] < 1 and time.monotonic() < deadline:
                time.sleep(0.005)
            t0 = time.perf_counter()
            info = pool.acquire()
            times.append(time.perf_counter() - t0)
            pool.release(info.id)
    return ms(times)


def workspace_ops(n: int) -> dict:
    """`n` forks, copies into a running sandbox and snapshots of one prepared workspace, alternated."""
    times: dict[str, list[float]] = {"fork": [], "copy": [], "snapshot": []}
    with LocalSandbox(Limits()) as box, LocalSandbox(Limits()) as spare:
        box.exec("head -c 20000000 /dev/urandom > data.bin && mkdir src && for i in $(seq 200); do echo $i > src/f$i.py; done")
        for _ in range(n):
            t0 = time.perf_counter()
            workspace.fork(box).stop()
            times["fork"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            workspace.copy_workspace(box, spare)
            times["copy"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            workspace.snapshot(box)
            times["snapshot"].append(time.perf_counter() - t0)
    return {f"workspace_{name}": ms(t) for name, t in times.items()}


def warm_acquires_http(url: str, token: str, n: int) -> dict:
    times = []
    h = {"Authorization": f"Bearer {token}"}
    with httpx.Client(headers=h, timeout=30) as http:
        for _ in range(n):
            deadline = time.monotonic() + 30
            while http.get(f"{url}/v1/health").json()["counts"]["ready"] < 1 and time.monotonic() < deadline:
                time.sleep(0.005)
            t0 = time.perf_counter()
            sid = http.post(f"{url}/v1/sandboxes").json()["id"]
            times.append(time.perf_counter() - t0)
            http.delete(f"{url}/v1/sandboxes/{sid}")
    return ms(times)


async def exec_load(url: str, token: str, rate: float, seconds: float, sandboxes: int) -> dict:
    h = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(headers=h, timeout=30, limits=limits) as http:
        ids = [(await http.post(f"{url}/v1/sandboxes")).json()["id"] for _ in range(sandboxes)]
        lat: list[float] = []
        lag: list[float] = []
        errors: list[str] = []

        async def one(i: int, when: float) -> None:
            now = time.perf_counter()
            lag.append(now - when)
            try:
                r = await http.post(f"{url}/v1/sandboxes/{ids[i % len(ids)]}/exec", json={"code": SNIPPET})
                body = r.json()
                if r.status_code != 200 or body.get("stdout") != "332833500\n":
                    errors.append(f"{r.status_code} {str(body)[:120]}")
            except httpx.HTTPError as e:
                errors.append(type(e).__name__)
            lat.append(time.perf_counter() - now)

        t0 = time.perf_counter()
        tasks = []
        total = int(rate * seconds)
        for i in range(total):
            when = t0 + i / rate
            delay = when - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, when)))
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
        for sid in ids:
            await http.delete(f"{url}/v1/sandboxes/{sid}")
    return {**ms(lat), "rate_target": rate, "rate_achieved": total / wall, "seconds": seconds,
            "errors": len(errors), "first_errors": errors[:5], "client_lag_p99_ms": pct(lag, 99) * 1e3,
            "sandboxes": sandboxes}


def render_table(res: dict) -> str:
    load = res["exec_load"]
    rows = [
        ("cold start (sandbox ready to run Python)", res["cold_start"], "p50 < 50"),
        *([("cold start, `/usr/bin/python3` stdlib only (the default before)", res["cold_start_system_python"], "")]
          if "cold_start_system_python" in res else []),
        ("warm acquire, in process (`Pool.acquire`)", res["warm_acquire_pool"], "< 10"),
        ("warm acquire, over HTTP (`POST /v1/sandboxes`)", res["warm_acquire_http"], "< 10"),
        (f"exec over HTTP, {load['rate_target']:g} calls/s for {load['seconds']:g} s", load,
         "0 errors, p99 < 200"),
        *[(f"workspace {what} (200 files + 20 MB)", res[f"workspace_{name}"], "")
          for name, what in (("fork", "fork: start a sandbox + copy"), ("copy", "copy into a running sandbox"),
                             ("snapshot", "snapshot (a tar)")) if f"workspace_{name}" in res],
    ]
    lines = ["| what | n | p50 ms | p90 ms | p99 ms | max ms | target |", "|---|---|---|---|---|---|---|"]
    for name, r, target in rows:
        lines.append(f"| {name} | {r['n']} | {r['p50_ms']:.1f} | {r['p90_ms']:.1f} | {r['p99_ms']:.1f} "
                     f"| {r['max_ms']:.1f} | {target} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke test: 20 exec/s for 5 s, fewer starts")
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--sandboxes", type=int, default=8)
    ap.add_argument("--starts", type=int, default=40, help="cold starts measured")
    ap.add_argument("--acquires", type=int, default=200, help="warm acquires measured (each way)")
    ap.add_argument("--workspace-ops", type=int, default=20, help="forks, copies and snapshots measured (root only)")
    ap.add_argument("--out", default=None, help="write the numbers here as JSON")
    ap.add_argument("--doc", default=None, help="replace the table in this markdown file (e.g. docs/sandbox.md)")
    a = ap.parse_args()
    if a.quick:
        a.rate, a.seconds, a.starts, a.acquires, a.workspace_ops = 20.0, 5.0, 8, 8, 4
    load_before = os.getloadavg()
    variants = {"cold_start": {}, **({"cold_start_system_python": SYSTEM_PYTHON}
                                     if os.path.exists(SYSTEM_PYTHON["python"]) else {})}
    res = {**cold_starts(a.starts, variants), "warm_acquire_pool": warm_acquires_in_process(a.acquires)}
    if os.geteuid() == 0 and a.workspace_ops:
        res.update(workspace_ops(a.workspace_ops))
    with tempfile.TemporaryDirectory() as tmp, running_service(tmp, "--warm", "2") as (url, token, _):
        res["warm_acquire_http"] = warm_acquires_http(url, token, a.acquires)
        res["exec_load"] = asyncio.run(exec_load(url, token, a.rate, a.seconds, a.sandboxes))
    res["machine"] = {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                      "python": sys.version.split()[0]}
    load = res["exec_load"]
    table = render_table(res)
    print(table)
    print(f"\nexec load: {load['rate_achieved']:.1f} calls/s achieved, {load['errors']} errors, "
          f"{load['sandboxes']} sandboxes; load average {load_before[0]:.1f} before, "
          f"{res['machine']['loadavg_after'][0]:.1f} after "
          f"on {res['machine']['cpus']} CPUs")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)
    if a.doc:
        write_doc_table(Path(a.doc), "sandbox-load", table)
    if load["errors"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
