"""`<run>/status.json`: how the dashboard knows whether a run is running, finished or failed.

The recipe writes it at start (`running`, with its pid and host), refreshes a
heartbeat at most every `heartbeat_s` seconds while it trains, and rewrites it
at the end: `finished`, `interrupted` (Ctrl-C) or `failed` with the error's
last line and traceback. A run whose file still says `running` but whose
process is gone (same host, pid not alive) or whose heartbeat is older than
`STALE_S` was killed without a word: readers report it as `failed`
("process ended without a status", e.g. SIGKILL or out of memory).
"""

from __future__ import annotations

import json
import os
import socket
import time
import traceback
from pathlib import Path
from typing import Any

STATUS_FILE = "status.json"
STALE_S = 300.0  # a heartbeat older than this (another host, where no pid can be checked): dead


class RunStatus:
    def __init__(self, run_dir: Path, heartbeat_s: float = 5.0) -> None:
        self.path = run_dir / STATUS_FILE
        self.heartbeat_s = heartbeat_s
        self.started = time.time()
        self._beat_at = 0.0
        self.step = 0

    def _write(self, state: str, **extra: Any) -> None:
        data = {"state": state, "pid": os.getpid(), "host": socket.gethostname(), "started": self.started,
                "heartbeat": time.time(), "step": self.step, **extra}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data) + "\n")
        os.replace(tmp, self.path)  # readers never see half a file

    def start(self) -> None:
        self._write("running")

    def beat(self, step: int) -> None:
        self.step = step
        now = time.time()
        if now - self._beat_at >= self.heartbeat_s:
            self._beat_at = now
            self._write("running")

    def finish(self) -> None:
        self._write("finished", ended=time.time())

    def interrupted(self) -> None:
        self._write("interrupted", ended=time.time())

    def failed(self, err: BaseException) -> None:
        lines = str(err).strip().splitlines()
        self._write("failed", ended=time.time(), error=f"{type(err).__name__}: {lines[-1] if lines else ''}",
                    traceback="".join(traceback.format_exception(err))[-20000:])


def read_status(run_dir: Path) -> dict[str, Any]:
    """The run's state as a reader should report it (see the module docstring)."""
    path = run_dir / STATUS_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        # Runs from before status.json: a summary means the recipe got to its end.
        return {"state": "finished" if (run_dir / "summary.json").exists() else "unknown"}
    if data.get("state") == "running" and not _alive(data):
        data["state"] = "failed"
        data["error"] = "process ended without a status (killed, or out of memory?)"
    return data


def _alive(data: dict[str, Any]) -> bool:
    if data.get("host") == socket.gethostname() and isinstance(data.get("pid"), int):
        try:
            os.kill(data["pid"], 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return time.time() - float(data.get("heartbeat", 0)) < STALE_S
