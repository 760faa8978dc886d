"""Start a real sandbox service (uvicorn on 127.0.0.1, a free port) in a subprocess, for tests and
benchmarks (which import it as tests.sandbox.service from the repository root); it is always
stopped. Not part of the installed package."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import httpx

from cadence.ports import free_port

__all__ = ["free_port", "running_service"]


@contextlib.contextmanager
def running_service(workdir: str, *extra: str, port: int | None = None, timeout_s: float = 60.0,
                    token: str | None = None):
    """Yields (url, token, process). Stops the service (SIGTERM, then SIGKILL) on the way out."""
    port = port or free_port()
    token_file = os.path.join(workdir, "token")
    if os.path.exists(token_file):
        os.remove(token_file)
    cmd = [sys.executable, "-m", "cadence.sandbox.server", "--port", str(port), "--token-file", token_file,
           "--events", os.path.join(workdir, "events.db"), *extra]
    log = open(os.path.join(workdir, f"service-{port}.log"), "ab")
    env = {k: v for k, v in os.environ.items() if k != "CADENCE_SANDBOX_TOKEN"}
    if token:
        env["CADENCE_SANDBOX_TOKEN"] = token
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"service exited with {proc.returncode}: see {log.name}")
            if os.path.exists(token_file):
                token = open(token_file).read().strip()
                try:
                    if httpx.get(f"{url}/v1/health", headers={"Authorization": f"Bearer {token}"},
                                 timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"service did not come up in {timeout_s} s: see {log.name}")
            time.sleep(0.05)
        yield url, token, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
