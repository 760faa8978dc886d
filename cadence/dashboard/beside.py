"""`logging.dashboard=true`: the dashboard in a subprocess beside a training run.

A subprocess, not a thread: its polling and JSON work never take the GIL from
the trainer. It serves the run's parent folder (so earlier runs show too) and
stops with the run.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from cadence.ports import free_port


class BesideDashboard:
    def __init__(self, proc: subprocess.Popen, url: str) -> None:
        self.proc, self.url = proc, url

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return s.getsockname()[1] > 0


def start_beside(port: int, run_dir: Path) -> BesideDashboard | None:
    """The dashboard of `run_dir`'s parent folder on `port` (logging.dashboard_port; 0: any free port)."""
    port = port or free_port()
    if not _port_free(port):
        print(f"note: logging.dashboard: port {port} is taken (a dashboard already running? it shows this run "
              f"too if it serves {run_dir.parent}); set logging.dashboard_port=0 for any free port", flush=True)
        return None
    cmd = [sys.executable, "-m", "cadence.dashboard", "--runs", str(run_dir.parent), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/#/run/{run_dir.name}"
    print(f"dashboard: {url} (stops with this run; `cadence dashboard --runs {run_dir.parent}` keeps one up)",
          flush=True)
    return BesideDashboard(proc, url)
