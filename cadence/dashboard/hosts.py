"""Which `Host:` headers the dashboard answers: a defence against DNS rebinding.

A page on evil.example can make its own name resolve to 127.0.0.1; the browser
then lets that page read what the dashboard on loopback answers, sending
`Host: evil.example:8484`. So only the names this server is reached by are
accepted: 127.0.0.1, localhost and ::1 with the port it serves on, plus, when
bound elsewhere, the bound address, this machine's names and any name given
with `--allow-host` (or `$CADENCE_DASHBOARD_HOSTS`, comma-separated).
"""

from __future__ import annotations

import os
import socket

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
HOSTS_ENV = "CADENCE_DASHBOARD_HOSTS"


def allowed_names(bound: str, extra: list[str] | None = None) -> set[str]:
    """The host names (no ports) a server bound to `bound` answers to."""
    names = set(LOOPBACK_NAMES) | {n.strip().lower() for n in extra or [] if n.strip()}
    names |= {n.strip().lower() for n in os.environ.get(HOSTS_ENV, "").split(",") if n.strip()}
    if bound not in LOOPBACK_NAMES:
        names |= {bound.strip("[]").lower(), socket.gethostname().lower(), socket.getfqdn().lower()}
    return names


def split_host(header: str) -> tuple[str, int | None]:
    """`name:port`, `[::1]:port` or `name` -> (name, port or None); a malformed port is -1."""
    if header.startswith("["):  # an IPv6 literal
        name, _, rest = header[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif header.count(":") == 1:
        name, port = header.split(":")
    else:
        name, port = header, ""
    if not port:
        return name.lower(), None
    return name.lower(), int(port) if port.isdigit() else -1


def host_allowed(header: str | None, names: set[str], server_port: int | None) -> bool:
    """Whether a request's Host header names this server. The port must be the one the server
    listens on (80 when the header has none); `*` in `names` accepts any host."""
    if "*" in names:
        return True
    if not header:
        return False
    name, port = split_host(header)
    if name not in names:
        return False
    return server_port is None or (port or 80) == server_port
