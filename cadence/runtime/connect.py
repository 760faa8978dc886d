"""Join the Ray cluster a run names (`runtime.address`), or start a local one.

Every part of a run that needs Ray (rollout actors, data-parallel trainer
ranks) calls `connect_ray` first; the first call connects, later ones find
Ray initialised and return.

Ray Client (`ray://host:port`) starts a fresh server process on the head for
each connection. That start can fail once and then succeed ("Starting Ray
client server failed"), e.g. on a busy head. So a `ray://` connection is
tried `attempts` times with a growing pause, each failure logged; the last
failure is raised as one line naming `runtime.address` and where to look.
"""

from __future__ import annotations

import logging
import time

from cadence.runtime.config import RuntimeConfig

log = logging.getLogger(__name__)


def connect_ray(runtime: RuntimeConfig, attempts: int = 3, pause_s: float = 2.0) -> None:
    import ray

    if ray.is_initialized():
        return
    client = str(runtime.address or "").startswith("ray://")
    for attempt in range(1, attempts + 1):
        try:
            ray.init(address=runtime.address, include_dashboard=False, logging_level="ERROR",
                     log_to_driver=True, configure_logging=True)
            return
        except ConnectionError as err:  # ConnectionAbortedError from the client server is one
            if not client:
                raise
            reason = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__  # the server's last line says why
            if attempt == attempts:
                raise RuntimeError(
                    f"runtime.address={runtime.address}: Ray Client could not connect after {attempts} attempts "
                    f"({reason}). Check that the head runs a client server on that port "
                    "(`ray start --head --ray-client-server-port=PORT`) and read its "
                    "ray_client_server*.err logs on the head."
                ) from err
            log.warning("Ray Client connection to %s failed (attempt %d of %d): %s; retrying",
                        runtime.address, attempt, attempts, reason)
            ray.shutdown()  # drop the half-made client context before the next try
            time.sleep(pause_s * attempt)
