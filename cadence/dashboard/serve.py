"""Serve the dashboard with uvicorn: 127.0.0.1 by default; bound anywhere else, it asks for
an access token (generated at start and printed in the address). Either way it answers only
requests whose Host header is one of its names (cadence/http_guards.py)."""

from __future__ import annotations

import argparse
import contextlib
import secrets
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from fastapi import FastAPI

from cadence.http_guards import LOOPBACK_NAMES, allowed_names
from cadence.ports import free_port

DEFAULT_PORT = 8484


def serve(runs: str = "runs", host: str = "127.0.0.1", port: int = DEFAULT_PORT, sandbox: list[str] | None = None,
          sandbox_token: str | None = None, token: str | None = None, poll_s: float = 1.0,
          allow_hosts: list[str] | None = None) -> None:
    """`allow_hosts`: more names the page may be opened by (a DNS name of this machine, a proxy's)."""
    import uvicorn

    from cadence.dashboard.app import HOSTS_ENV, create_app
    from cadence.dashboard.sandboxes import SandboxService

    if host not in LOOPBACK_NAMES and not token:
        token = secrets.token_urlsafe(24)
    services = [SandboxService(url, sandbox_token) for url in sandbox or []]
    app = create_app(Path(runs), services, token=token, poll_s=poll_s, hosts=allowed_names(host, allow_hosts, HOSTS_ENV))
    address = f"http://{host}:{port}/" + (f"?token={token}" if token else "")
    print(f"cadence dashboard on {address} (runs under {Path(runs).resolve()})", file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


@contextlib.contextmanager
def serving_in_thread(app: FastAPI, timeout_s: float = 30.0) -> Iterator[str]:
    """Serve `app` on a free 127.0.0.1 port in a thread of this process; yields the base URL
    (for the screenshot tool and tests). The server stops on the way out."""
    import uvicorn

    port = free_port()
    # Open server-sent-event streams get a second to end, then are cut.
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the dashboard did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="cadence dashboard")
    p.add_argument("--runs", default="runs")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--sandbox", action="append", default=[])
    p.add_argument("--sandbox-token", default=None)
    p.add_argument("--token", default=None)
    p.add_argument("--poll-s", type=float, default=1.0)
    p.add_argument("--allow-host", action="append", default=[],
                   help="another name the page may be opened by (repeatable; '*': any)")
    a = p.parse_args(argv)
    serve(a.runs, a.host, a.port, a.sandbox, a.sandbox_token, a.token, a.poll_s, a.allow_host)
