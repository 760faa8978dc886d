"""The dashboard app served by a real uvicorn in a thread, on a free 127.0.0.1 port."""

from __future__ import annotations

import contextlib
import threading
import time

import httpx
import uvicorn
from fastapi import FastAPI

from cadence.sandbox.testing import free_port


@contextlib.contextmanager
def serving(app: FastAPI):
    """Yields the base URL; the server stops on the way out."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("dashboard did not start")
        time.sleep(0.02)
    try:
        yield url
    finally:
        server.should_exit = True
        server.force_exit = True  # SSE streams stay open: do not wait for them
        thread.join(timeout=10)


def sse_events(response: httpx.Response):
    """(event, data) pairs of a server-sent-event stream."""
    event = None
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: ") and event:
            yield event, line[6:]
            event = None
