"""Unattended runs: `cadence train` under a supervisor that resumes a failed run by itself.

With `runtime.max_restarts=N` (N > 0), `cadence train` becomes a small parent
process that runs the real training as a child (`python -m cadence train ...`
with the same arguments). When the child dies (a Python error, kill -9, the
OOM killer, a lost trainer rank) the supervisor waits
`runtime.restart_backoff_s * 2**k` seconds (k = restarts so far) and starts
it again with `--resume`: it continues from the last checkpoint, and the
metrics logged after that checkpoint are dropped and logged again, so every
step appears once in metrics.jsonl. After N restarts it gives up.

Each restart and its cause go to `<run>/restarts.jsonl`, one JSON object a
line; the rollout workers append theirs there too (a dead actor that Ray
restarted, see `cadence/runtime/actors.py`), so the file is the run's one record
of what went wrong. With `logging.webhook_url` set, a JSON POST announces
each restart, the final failure, and the finish.

A dead critic actor (`runtime.critic_actor`) ends the child the same way:
its weights and optimizer moments change every step and lived only in it,
so a replacement built in place would pair an older critic with the newer
policy; resuming both from the checkpoint keeps them consistent. Its entry
names the role "critic". A dead actor_attn or rollout actor is replaced in
place instead (their state is the policy's weights and a prompt position,
both held outside them; `cadence/runtime/actors.py`).

A child that exits with a config error (2) or was interrupted (Ctrl-C, 130)
is not restarted: running it again would not help.
"""

from __future__ import annotations

import collections
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from cadence.observe.config import LoggingConfig
from cadence.runtime.config import RuntimeConfig

CHILD_ENV = "CADENCE_SUPERVISED"  # set in the child, so it trains instead of supervising again
RESTARTS_FILE = "restarts.jsonl"
NOT_RESTARTED = {0: "finished", 2: "config error", 130: "interrupted"}


def record_restart(run_dir: Path, entry: dict[str, Any]) -> None:
    """Append one restart (role, cause, ...) to `<run>/restarts.jsonl`, stamped with the time."""
    run_dir.mkdir(parents=True, exist_ok=True)
    stamped = {"time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), **entry}
    with (run_dir / RESTARTS_FILE).open("a") as f:
        f.write(json.dumps(stamped) + "\n")


def post_webhook(url: str | None, message: dict[str, Any]) -> None:
    """JSON POST to `url`; a webhook that is down never stops the run (printed, not raised)."""
    if not url:
        return
    request = urllib.request.Request(
        url, data=json.dumps(message).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            reply.read()
    except OSError as err:
        print(f"supervisor: webhook {url} failed: {err}", file=sys.stderr)


def exit_cause(code: int, tail: list[str]) -> str:
    """One line: the signal that killed the child, or its last error line."""
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    errors = [line for line in tail if line and not line.startswith((" ", "\t")) and ("Error" in line or "Exception" in line)]
    return f"exit code {code}: {errors[-1] if errors else (tail[-1] if tail else 'no output')}"


def failed_role(cause: str) -> str:
    """Whose death ended the child: an actor that ActorDiedError names (the critic), else the trainer."""
    found = re.search(r"ActorDiedError: the (\S+) actor died", cause)
    return found.group(1) if found else "trainer"


def last_checkpoint_step(run_dir: Path) -> int | None:
    from cadence.train.checkpoint import latest_checkpoint

    found = latest_checkpoint(run_dir) if run_dir.exists() else None
    return found[0] if found else None


def _run_child(args: list[str]) -> tuple[int, list[str]]:
    """Run `python -m cadence train <args>`, passing its output through; exit code and last lines."""
    env = {**os.environ, CHILD_ENV: "1", "PYTHONUNBUFFERED": "1"}
    child = subprocess.Popen(
        [sys.executable, "-m", "cadence", "train", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
    )
    tail: collections.deque[str] = collections.deque(maxlen=40)
    try:
        assert child.stdout is not None
        for line in child.stdout:
            sys.stdout.write(line)
            tail.append(line.rstrip("\n"))
        return child.wait(), list(tail)
    except KeyboardInterrupt:  # the child got the same Ctrl-C; let it save and report
        return child.wait(), list(tail)


def supervise(rt: RuntimeConfig, logging: LoggingConfig, args: list[str], resume: bool) -> int:
    """Train the run of the command-line `args` in a child until it finishes or has failed
    `runtime.max_restarts` + 1 times; returns the last child's exit code. `logging` names the
    run's folder (restarts.jsonl) and the webhook."""
    run_dir, url = logging.resolved_run_dir(), logging.webhook_url
    base = {"run": logging.name, "run_dir": str(run_dir)}
    restarts = 0
    while True:
        code, tail = _run_child([*args, *(["--resume"] if resume and "--resume" not in args else [])])
        step = last_checkpoint_step(run_dir)
        if code in NOT_RESTARTED:
            if code == 0:
                post_webhook(url, {**base, "event": "finished", "restarts": restarts, "step": step})
            return code
        cause = exit_cause(code, tail)
        role = failed_role(cause)
        if restarts >= rt.max_restarts:
            record_restart(run_dir, {"role": role, "cause": cause, "action": "gave up", "restarts": restarts})
            post_webhook(url, {**base, "event": "failed", "cause": cause, "restarts": restarts, "step": step})
            print(f"supervisor: the run failed ({cause}) after {restarts} restart(s); giving up", file=sys.stderr)
            return code
        delay = rt.restart_backoff_s * 2**restarts
        restarts += 1
        entry = {"role": role, "cause": cause, "restart": restarts, "resume_from_step": step, "delay_s": delay}
        record_restart(run_dir, entry)
        post_webhook(url, {**base, "event": "restarting", **entry})
        print(f"supervisor: the run failed ({cause}); restart {restarts}/{rt.max_restarts} from checkpoint "
              f"step {step} in {delay:g} s", file=sys.stderr)
        time.sleep(delay)
        resume = True  # from now on: continue from the last checkpoint (or start, if there is none)
