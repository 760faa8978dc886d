"""Guards for the HTTP servers cadence runs for a browser or a program on this machine (the
dashboard, the agent endpoint, `cadence serve`, the sandbox service): which names a request may
address them by, where it may come from, and how much it may send.

Host (DNS rebinding). A page on evil.example can make its own name resolve to 127.0.0.1; the
browser then lets that page read what a server on loopback answers, sending
`Host: evil.example:PORT`. So only the names a server is reached by are accepted: 127.0.0.1,
localhost and ::1 with the port it serves on, plus, when bound elsewhere, the bound address, this
machine's names and any name given (`extra`, or the names in the environment variable `env`,
comma-separated).

Origin (cross-site requests). A page anywhere can make the browser POST to 127.0.0.1 (a
`text/plain` form needs no preflight); the browser says where it comes from in `Origin`. A
request that carries an Origin must come from one of the server's own names; programs (the
openai client, curl) send none.

Body size. `BodyLimit` refuses a body over its limit with 413 before the app holds it.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit

from starlette.responses import JSONResponse

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def allowed_names(bound: str, extra: list[str] | None = None, env: str | None = None) -> set[str]:
    """The host names (no ports) a server bound to `bound` answers to."""
    names = set(LOOPBACK_NAMES) | {n.strip().lower() for n in extra or [] if n.strip()}
    if env is not None:
        names |= {n.strip().lower() for n in os.environ.get(env, "").split(",") if n.strip()}
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


def origin_allowed(header: str | None, names: set[str], server_port: int | None) -> bool:
    """Whether a request's Origin (absent: not a browser's cross-site request) is this server's
    own: http://NAME:PORT with NAME one of `names`. `null` (a sandboxed frame, a file) is not."""
    if header is None:
        return True
    parts = urlsplit(header)
    if parts.scheme != "http" or not parts.netloc:
        return False
    return host_allowed(parts.netloc, names, server_port)


class HostOriginCheck:
    """ASGI middleware for a server that only programs on this machine call (the agent endpoint):
    a request must name the server in Host (421), carry no foreign Origin (403), and send a POST
    body as application/json (415: what a cross-site page cannot send without a preflight, which
    this server does not answer)."""

    def __init__(self, app, names: set[str], what: str) -> None:
        self.app, self.names, self.what = app, names, what

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        port = scope["server"][1] if scope.get("server") else None
        refusal = self._refusal(scope["method"], headers, port)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, message = refusal
        await JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                      "code": None}}, status_code=status)(scope, receive, send)

    def _refusal(self, method: str, headers: dict[str, str], port: int | None) -> tuple[int, str] | None:
        host, origin = headers.get("host"), headers.get("origin")
        if not host_allowed(host, self.names, port):
            return 421, (f"Host {host!r} is not a name of {self.what} (DNS rebinding?): use "
                         f"http://127.0.0.1:{port}/")
        if not origin_allowed(origin, self.names, port):
            return 403, f"a request from the web page at {origin!r} is not served: {self.what} is for local programs"
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if method == "POST" and content_type != "application/json":
            return 415, f"send the request body as JSON with Content-Type: application/json, not {content_type!r}"
        return None


class BodyLimit:
    """ASGI middleware: refuses a request body over `max_bytes` with 413 before the app holds it:
    by its Content-Length, or, sent in chunks, as soon as the chunks pass it. `setting` names what
    sets the limit and `advice` what to do instead, for the error."""

    def __init__(self, app, max_bytes: int, setting: str, advice: str) -> None:
        self.app, self.max_bytes, self.setting, self.advice = app, max_bytes, setting, advice

    def _too_large(self) -> JSONResponse:
        message = f"request body over {self.max_bytes >> 20} MiB ({self.setting}); {self.advice}"
        return JSONResponse({"detail": message, "error": "BodyTooLarge"}, status_code=413)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None:  # the server holds the body to exactly this length
            if not length.isdigit() or int(length) > self.max_bytes:
                await self._too_large()(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        # Chunked: read it here, up to the limit, and hand the app what was read.
        body, more = b"", True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":
                return  # the client went away
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
            if len(body) > self.max_bytes:
                await self._too_large()(scope, receive, send)
                return
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)
