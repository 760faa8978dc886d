"""Fault injection: episodes that use sandboxes while sandboxes are killed (kill -9), hung
(SIGSTOP for good), slowed (SIGSTOP for 0.3 s), and the service is crashed (kill -9) and
restarted once, halfway. Every episode must complete or be retried, none may be lost, and the
event log and the status API must show every replacement with its cause.

    python benchmarks/sandbox_faults.py --mode rollout   # the agentic pipeline, 200 episodes
    python benchmarks/sandbox_faults.py --mode service   # the service's own episodes, 200
    ... --quick                                          # 40 episodes

rollout: the agentic pipeline's real rollout (`EpisodeProducer` -> `run_episode` over an
  `InferenceHub` with the embedded engine and the built-in model) on a hosted environment:
  `HostedEnv`, whose every reset and step runs in a sandbox of the service (the environment
  object lives in the sandbox's Python session, its ledger in the sandbox's workspace; the last
  turn checks that both survived, reward 1.0). A lost episode (the environment raised, timed out
  or died) is counted by `EpisodeProducer` and retried on the same seed; a group that ran out of
  retries would be dropped: those are the lost ones.
service: each episode is a multi-turn task in one sandbox over the SDK (write the input, three
  turns building state in the Python session, a checked answer); a failed one is retried from
  the start in a new sandbox.

Faults are aimed at the service's sandboxes by the status API (each sandbox's agent pid), and
each is checked afterwards against the event log: the sandbox generation it hit must have
died with a cause (or have been released by its client first). Needs root and bubblewrap.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import faulthandler
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from cadence.sandbox.client import Sandbox
from cadence.sandbox.models import SandboxError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tests.sandbox.service
from tests.sandbox.service import free_port, running_service  # noqa: E402

TOKEN = "sandbox-faults-benchmark-token-0123456789"
SERVICE_ARGS = ("--warm", "4", "--health-period-s", "0.5")
CAUSES = ("process exited", "hung", "slow", "failing", "died during a call", "service restarted", "idle reaped")
RELEASED = ("released", "environment closed", "pool closing")


# -- the environment the rollout mode hosts (runs on the sandbox's Python: standard library) ------
LEDGER = '''
class Ledger:
    """Three turns; each folds the action's length into a total kept twice: in this object (the
    sandbox's Python session) and in a file (its workspace). The last turn checks both agree."""

    def reset(self, seed):
        self.turns, self.total = 0, seed
        with open("ledger.txt", "w") as f:
            f.write(f"{seed}\\n")
        return f"ledger {seed}: say anything, three times", {}

    def step(self, action):
        self.turns += 1
        self.total = (self.total * 31 + len(action)) % 1000003
        with open("ledger.txt", "a") as f:
            f.write(f"{len(action)}\\n")
        first, *rest = [int(x) for x in open("ledger.txt").read().split()]
        for n in rest:
            first = (first * 31 + n) % 1000003
        done = self.turns == 3
        return f"total {self.total}", float(done and first == self.total), done, False, {}
'''


def run_rollout(url: str, episodes: int, group_size: int, in_flight: int, progress: list[int],
                template: str | None = None) -> dict:
    """Play `episodes` episodes through EpisodeProducer (groups of `group_size`, at most `in_flight`
    at a time); progress[0] counts the episodes that reached the buffer."""
    import torch

    from cadence.envs.runner import EnvRunner
    from cadence.inference.embedded import EmbeddedEngine
    from cadence.inference.hub import InferenceHub
    from cadence.inference.types import SamplingParams
    from cadence.models.loading import load_policy, load_tokenizer
    from cadence.rollout.episode_producer import EpisodeProducer
    from cadence.sandbox.hosted_env import HostedEnv

    torch.set_num_threads(1)
    tokenizer = load_tokenizer("builtin")
    hub = InferenceHub([EmbeddedEngine(load_policy("builtin").eval(), tokenizer, max_batch_size=16, seed=0)])

    def make_env() -> HostedEnv:
        return HostedEnv(url, TOKEN, source=LEDGER, class_name="Ledger", step_timeout_s=3.0, template=template)

    rollout = EpisodeProducer(
        hub, lambda: EnvRunner(make_env, step_timeout_s=15.0, action_tag=None), tokenizer,
        SamplingParams(max_new_tokens=8), group_size, max_retries=50, max_context_tokens=512,
    )
    groups = episodes // group_size
    finished: list = []

    async def play(gid: int) -> None:
        group = await rollout.play(gid, gid)
        if group is not None:
            finished.append(group)
            progress[0] = len(finished) * group_size

    async def main() -> None:
        stop = asyncio.Event()
        server = asyncio.create_task(hub.serve(stop))
        running: set[asyncio.Task] = set()
        try:
            for gid in range(groups):
                while rollout.in_flight() + group_size > in_flight:  # at most `in_flight` episodes at a time
                    await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                    running = {t for t in running if not t.done()}
                running.add(asyncio.ensure_future(play(gid)))
                await asyncio.sleep(0)  # the group opens: its episodes count as in flight
            await asyncio.gather(*running)
        finally:
            await rollout.stop()
            stop.set()
            await server

    asyncio.run(main())
    samples = [s for g in finished for s in g.samples]
    failures = rollout.failures
    return {"completed": len(samples), "lost": failures.groups_dropped * group_size,
            "groups_dropped": failures.groups_dropped, "retried_episodes_attempts": failures.retried,
            "failures": {f"lost/{k}": v for k, v in failures.lost_by_kind.items()},
            "rewards_not_1": sum(s.reward != 1.0 for s in samples), "turns": rollout.turn_total,
            "engine": "embedded (built-in model)"}


# -- the service's own episodes ----------------------------------------------------------------
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


def run_service_episodes(url: str, episodes: int, workers: int, progress: list[int]) -> dict:
    stats: collections.Counter = collections.Counter()

    def with_retries(i: int) -> None:
        for attempt in range(20):
            try:
                episode(url, i)
                stats["completed"] += 1
                stats["retries"] += attempt
                progress[0] += 1
                return
            except (SandboxError, httpx.HTTPError) as e:
                stats[f"failure: {type(e).__name__}"] += 1
                time.sleep(min(0.2 * 2 ** attempt, 3.0))
        stats["lost"] += 1

    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(with_retries, range(episodes)))
    return {"completed": stats["completed"], "lost": stats["lost"], "retried_episodes_attempts": stats["retries"],
            "failures": {k: v for k, v in stats.items() if k.startswith("failure")}}


# -- faults --------------------------------------------------------------------------------------
class Injector:
    """Runs the service, and every `period_s` hits one of its sandboxes (chosen from /v1/status)."""

    def __init__(self, stack: contextlib.ExitStack, workdir: str, seed: int) -> None:
        self.stack, self.workdir, self.port = stack, workdir, free_port()
        self.rng = random.Random(seed)
        self.counts: collections.Counter = collections.Counter()
        self.hits: list[dict] = []  # every kill/hang: which sandbox generation it hit
        self.replaced_in_status: dict[tuple[str, int], str] = {}  # (id, generation) -> last_reason seen
        self.error: str | None = None
        self.service = stack.enter_context(contextlib.ExitStack())
        self.url, _, self.proc = self.service.enter_context(self._start())
        self.http = stack.enter_context(httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30))

    def _start(self):
        return running_service(self.workdir, *SERVICE_ARGS, port=self.port, token=TOKEN)

    def restart(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)  # a crash: its sandboxes die with it
        self.proc.wait()
        self.service.close()
        url, _, self.proc = self.service.enter_context(self._start())
        assert url == self.url
        self.counts["service restart"] += 1

    def status(self) -> list[dict]:
        try:
            sandboxes = self.http.get(f"{self.url}/v1/status").json()["sandboxes"]
        except (httpx.HTTPError, ValueError, KeyError):
            return []
        for s in sandboxes:
            if s["replacements"] > 0:
                self.replaced_in_status[(s["id"], s["generation"])] = s["last_reason"]
        return sandboxes

    def inject(self) -> None:
        targets = [s for s in self.status() if s["state"] in ("ready", "busy") and s["pid"]]
        if not targets:
            return
        s, action = self.rng.choice(targets), self.rng.choice(["kill", "kill", "hang", "slow"])
        try:
            if action == "kill":
                os.kill(s["pid"], signal.SIGKILL)
            elif action == "hang":
                os.kill(s["pid"], signal.SIGSTOP)  # for good: the health check must notice
            else:
                os.kill(s["pid"], signal.SIGSTOP)
                threading.Timer(0.3, _signal, (s["pid"], signal.SIGCONT)).start()
        except ProcessLookupError:
            return
        self.counts[action] += 1
        if action != "slow":
            self.hits.append({"id": s["id"], "generation": s["generation"], "action": action, "state": s["state"]})

    def drive(self, done: threading.Event, progress: list[int], episodes: int, period_s: float = 0.25) -> None:
        try:
            while not done.wait(period_s):
                if not self.counts["service restart"] and progress[0] >= episodes // 2:
                    self.restart()
                else:
                    self.inject()
        except Exception as e:  # reported in the results (and fails the run), not lost with the thread
            self.error = f"{type(e).__name__}: {e}"


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def cause_of(reason: str) -> str | None:
    return next((c for c in CAUSES if c in reason), None)


def account(events: list[dict], hits: list[dict], replaced_in_status: dict) -> dict:
    """Match every fault to what the event log says happened to the sandbox generation it hit,
    and check every replacement in the log names its cause."""
    dead = {(e["sandbox_id"], e["generation"]): e["reason"] for e in events if e["state"] == "dead"}
    outcome: collections.Counter = collections.Counter()
    unaccounted = []
    for h in hits:
        reason = dead.get((h["id"], h["generation"]))
        if reason is None:
            # a restart marks sandboxes dead at generation -1 (it does not know theirs)
            reason = dead.get((h["id"], -1))
        if reason is None:
            history = [(e["generation"], e["state"], e["reason"][:80]) for e in events if e["sandbox_id"] == h["id"]]
            unaccounted.append({**h, "events": history})
        elif reason.startswith(RELEASED):
            outcome["stopped by its client before the health check saw it"] += 1
        else:
            outcome[f"died: {cause_of(reason) or reason[:60]}"] += 1
    replacements = [e for e in events if e["state"] == "busy" and e["reason"].startswith("replaced (cause:")]
    deaths = collections.Counter(cause_of(e["reason"]) or e["reason"][:60] for e in events
                                 if e["state"] == "dead" and not e["reason"].startswith(RELEASED))
    return {
        "faults_matched_to_events": dict(outcome), "faults_unaccounted": unaccounted,
        "deaths_in_event_log_by_cause": dict(deaths),
        "replacements_in_event_log": len(replacements),
        "replacements_without_a_known_cause": [e["reason"] for e in replacements if cause_of(e["reason"]) is None],
        "replacements_seen_in_status_api": len(replaced_in_status),
        "status_api_replacements_by_cause": dict(collections.Counter(
            cause_of(r) or r[:60] for r in replaced_in_status.values())),
    }


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
    ap.add_argument("--mode", choices=("rollout", "service"), default="rollout")
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--workers", type=int, default=8, help="episodes in flight")
    ap.add_argument("--group-size", type=int, default=4, help="rollout mode: episodes per seed")
    ap.add_argument("--quick", action="store_true", help="40 episodes (service mode), 24 (rollout mode)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--template", default=None, help="rollout mode: the hosted envs' sandboxes start on this "
                    "template (its name in the service's store, $CADENCE_TEMPLATE_DIR)")
    a = ap.parse_args()
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID` prints where every thread is
    if a.quick:
        a.episodes = 40 if a.mode == "service" else 24
    load_before = os.getloadavg()
    progress, done = [0], threading.Event()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        inj = Injector(stack, tmp, a.seed)
        driver = threading.Thread(target=inj.drive, args=(done, progress, a.episodes), daemon=True)
        t0 = time.monotonic()
        driver.start()
        try:
            if a.mode == "rollout":
                res = run_rollout(inj.url, a.episodes, a.group_size, a.workers, progress, a.template)
            else:
                res = run_service_episodes(inj.url, a.episodes, a.workers, progress)
        finally:
            done.set()
            driver.join()
        wall = time.monotonic() - t0
        # A sandbox hung at the end is noticed by a probe (5.5 s), or by a call in it (its wall
        # clock plus 5 s; 15 s for a file op).
        deadline = time.monotonic() + 30.0
        while True:
            inj.status()
            events = inj.http.get(f"{inj.url}/v1/events", params={"limit": 100000}).json()
            checks = account(events, inj.hits, inj.replaced_in_status)
            if not checks["faults_unaccounted"] or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        while True:  # spares still starting are not leases: let them finish
            status = inj.http.get(f"{inj.url}/v1/status").json()
            if not status["counts"]["starting"] or time.monotonic() > deadline + 10.0:
                break
            time.sleep(0.2)
        leftover = [(s["id"], s["state"], s["last_reason"]) for s in status["sandboxes"] if s["state"] != "ready"]
    orphans = orphan_sandboxes()
    res = {"mode": a.mode, "episodes": a.episodes, "template": a.template, **res, "faults_injected": dict(inj.counts),
           "injector_error": inj.error, **checks,
           "events": len(events), "status_counts_after": status["counts"], "leftover_leases": leftover,
           "orphan_sandboxes_after": orphans, "wall_s": wall,
           "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()}}
    print(json.dumps(res, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)
    ok = (res["lost"] == 0 and inj.error is None and res["completed"] == a.episodes and not orphans and not leftover
          and not checks["faults_unaccounted"] and not checks["replacements_without_a_known_cause"]
          and not res.get("rewards_not_1"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
