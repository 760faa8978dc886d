"""What tests read of an `InferenceHub` from outside: its replicas' loads, and whether it is idle."""

from __future__ import annotations

from cadence.inference.hub import InferenceHub


def in_flight(hub: InferenceHub) -> list[int]:
    """Requests in flight per replica (queued in the hub or in its engine): what routing balances."""
    return [replica.load() for replica in hub.replicas]


def busy(hub: InferenceHub) -> bool:
    """Requests in flight, or weights waiting to be swapped in."""
    return any(in_flight(hub)) or hub.weights_pending()
