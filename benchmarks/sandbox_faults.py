"""Fault injection: sandbox-using episodes while sandboxes are killed, hung, slowed, and the
service is crashed (kill -9) and restarted once. Every episode must complete or be retried;
none may be lost, and the event log must show every replacement with its cause.

    python benchmarks/sandbox_faults.py             # 200 episodes
    python benchmarks/sandbox_faults.py --quick     # 40 episodes

An episode is a small multi-turn task in one sandbox (the shape of an agent episode): write its
input file, three turns in the Python session that build state, a final answer checked against
the known one. A failed sandbox call (503: died and replaced; connection refused while the
service restarts) fails the episode, which is retried from the start in a new sandbox. Faults
hit the agents of this service's sandboxes only (found by walking its process tree). Needs root
and bubblewrap (sandboxes get their own host uids; the agents are found through them).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from cadence.sandbox.client import Sandbox
from cadence.sandbox.models import SandboxError
from cadence.sandbox.testing import free_port, running_service

TOKEN = "sandbox-faults-benchmark-token-0123456789"


def episode(url: str, i: int) -> None:
    with Sandbox(url, TOKEN, timeout_s=60) as sb:
        sb.write_file("input.txt", str(i))
        sb.exec(code="acc = [int(open('input.txt').read())]", session=True)
        for turn in range(3):
            r = sb.exec(code=f"acc.append(acc[-1] * 2 + {turn}); import time; time.sleep(0.05)", session=True)
            if not r.ok:
                raise SandboxError(f"turn {turn} failed: {r.exit_code} {r.stderr[-200:]}")
        r = sb.exec(code="print(acc[-1])", session=True)
        if r.session_started or r.stdout != f"{((i * 2) * 2 + 1) * 2 + 2}\n":
            raise SandboxError(f"wrong answer {r.stdout!r} (session restarted: {r.session_started})")


def run_with_retries(url: str, i: int, stats: collections.Counter) -> bool:
    for attempt in range(20):
        try:
            episode(url, i)
            stats["completed"] += 1
            stats["retries"] += attempt
            return True
        except (SandboxError, httpx.HTTPError) as e:
            stats[f"failure: {type(e).__name__}: {_kind(str(e))}"] += 1
            time.sleep(min(0.2 * 2 ** attempt, 3.0))
    stats["lost"] += 1
    return False


def _kind(msg: str) -> str:
    """An error message without its ids and numbers, to count failures by kind."""
    for key in ("died during the call", "being replaced", "no sandbox service could create", "no sandbox",
                "wrong answer", "session restarted", "Connection refused", "turn"):
        if key in msg:
            return key
    return msg[:80]


CAUSES = ("process exited", "hung", "slow", "failing", "died during a call", "service restarted", "idle reaped")


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def agents_of(root_pid: int) -> list[int]:
    """Agent pids under the service: the (non-bwrap) children of its bwrap processes."""
    children = collections.defaultdict(list)
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children[ppid].append(int(name))
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        for kid in children.get(pid, []):
            todo.append(kid)
            if _is_bwrap(pid) and not _is_bwrap(kid):
                out.append(kid)
    return out


def orphan_sandboxes(wait_s: float = 10.0) -> list[int]:
    """bwrap processes left behind by a dead service (reparented to init), after `wait_s` for
    the ones still ending: there must be none."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for name in os.listdir("/proc"):
            if name.isdigit() and _is_bwrap(int(name)):
                try:
                    with open(f"/proc/{name}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    if fields[1] == "1" and fields[0] != "Z":
                        found.append(int(name))
                except (OSError, IndexError):
                    continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def _is_bwrap(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[0].endswith(b"bwrap")
    except OSError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.quick:
        a.episodes = 40
    rng = random.Random(a.seed)
    stats: collections.Counter = collections.Counter()
    faults: collections.Counter = collections.Counter()
    port = free_port()
    args = ("--warm", "2", "--health-period-s", "0.5")
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        url, _, proc = stack.enter_context(running_service(tmp, *args, port=port, token=TOKEN))
        t0 = time.monotonic()
        with ThreadPoolExecutor(a.workers) as ex:
            futs = [ex.submit(run_with_retries, url, i, stats) for i in range(a.episodes)]
            restarted = False
            while not all(f.done() for f in futs):
                time.sleep(0.25)
                done = sum(f.done() for f in futs)
                if not restarted and done >= a.episodes // 2:
                    os.kill(proc.pid, signal.SIGKILL)  # crash the service (its sandboxes die with it)
                    proc.wait()
                    stack.close()
                    url2, _, proc = stack.enter_context(running_service(tmp, *args, port=port, token=TOKEN))
                    assert url2 == url
                    restarted, faults["service restart"] = True, 1
                    continue
                agents = agents_of(proc.pid)
                if not agents:
                    continue
                pid, action = rng.choice(agents), rng.choice(["kill", "kill", "hang", "slow"])
                try:
                    if action == "kill":
                        os.kill(pid, signal.SIGKILL)
                    elif action == "hang":
                        os.kill(pid, signal.SIGSTOP)  # for good: the health check must notice
                    else:
                        os.kill(pid, signal.SIGSTOP)
                        threading.Timer(0.3, _signal, (pid, signal.SIGCONT)).start()
                    faults[action] += 1
                except ProcessLookupError:
                    pass
        wall = time.monotonic() - t0
        h = {"Authorization": f"Bearer {TOKEN}"}
        events = httpx.get(f"{url}/v1/events", params={"limit": 100000}, headers=h, timeout=30).json()
        status = httpx.get(f"{url}/v1/status", headers=h, timeout=30).json()
        leftover = [(s["id"], s["state"], s["last_reason"]) for s in status["sandboxes"] if s["state"] != "ready"]
    orphans = orphan_sandboxes()
    causes: collections.Counter = collections.Counter()
    for e in events:
        if e["state"] == "dead" and not e["reason"].startswith(("released", "pool closing")):
            causes[next((c for c in CAUSES if c in e["reason"]), e["reason"][:60])] += 1
    res = {"episodes": a.episodes, "completed": stats["completed"], "retried_episodes_attempts": stats["retries"],
           "lost": stats["lost"], "failures": {k: v for k, v in stats.items() if k.startswith("failure")},
           "faults_injected": dict(faults), "deaths_in_event_log_by_cause": dict(causes),
           "events": len(events), "status_counts_after": status["counts"], "leftover_leases": leftover,
           "orphan_sandboxes_after": orphans,
           "wall_s": wall}
    print(json.dumps(res, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)
    sys.exit(0 if res["lost"] == 0 and res["completed"] == a.episodes and not orphans else 1)


if __name__ == "__main__":
    main()
