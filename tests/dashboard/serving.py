"""Helpers of the dashboard tests: the app served in a thread, and a server-sent-event reader."""

from __future__ import annotations

import httpx
from fastapi.testclient import TestClient

from cadence.dashboard.serve import serving_in_thread as serving  # noqa: F401  (the tests import it from here)


def sse_events(response: httpx.Response):
    """(event, data) pairs of a server-sent-event stream."""
    event = None
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: ") and event:
            yield event, line[6:]
            event = None


def local_client(app) -> TestClient:
    """A test client that calls the app as a browser on this machine does (Host: 127.0.0.1:8484;
    the dashboard refuses other names)."""
    return TestClient(app, base_url="http://127.0.0.1:8484")
