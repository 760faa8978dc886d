"""The sandbox view: each service's sandboxes and event log, through its HTTP API.

A service gives per sandbox its state, generation, creation time, calls,
replacements, the last reason, its limits and, where the service measures
them, CPU seconds and memory (GET /v1/status), and an append-only event log
(GET /v1/events?since_id=N, read incrementally here). A failure is an event
whose state is `dead` or `unhealthy`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import httpx

from cadence.sandbox.client import resolve

EVENTS_KEPT = 2000
FAILURE_STATES = ("dead", "unhealthy")


class SandboxService:
    def __init__(self, url: str, token: str | None = None) -> None:
        [self.url], self.token = resolve(url, token)
        self._client = httpx.Client(headers={"Authorization": f"Bearer {self.token}"}, timeout=3.0)
        self.events: deque = deque(maxlen=EVENTS_KEPT)
        self._since = 0
        self._lock = threading.Lock()

    def snapshot(self) -> dict[str, Any]:
        """Status, sandboxes with their age, and the events logged since the last call."""
        with self._lock:
            try:
                status = self._client.get(f"{self.url}/v1/status").raise_for_status().json()
                new = self._client.get(f"{self.url}/v1/events", params={"since_id": self._since, "limit": 5000})
                new = new.raise_for_status().json()
            except (httpx.HTTPError, ValueError) as err:
                return {"url": self.url, "ok": False, "error": f"{type(err).__name__}: {err}"}
            self.events.extend(new)
            if new:
                self._since = new[-1]["id"]
        now = time.time()
        for box in status["sandboxes"]:
            box["age_s"] = now - box["created_at"]
            box["idle_s"] = now - box["last_used"]
        failures = [e for e in self.events if e["state"] in FAILURE_STATES][-50:]
        return {"url": self.url, "ok": True, "counts": status["counts"], "sandboxes": status["sandboxes"],
                "failures": failures[::-1], "events": list(self.events)[-200:][::-1]}

    def close(self) -> None:
        self._client.close()
