"""Who may call the sandbox service, and how much they may send.

Tokens: the service's own token (written to --token-file, or $CADENCE_SANDBOX_TOKEN) is the
admin's: it sees and acts on every sandbox and issues client tokens. A client token (issued with
`POST /v1/clients`, `cadence sandbox client add NAME`, or listed in --clients-file) sees and acts
on the sandboxes and environments it created only; another client's are 404 to it, as if they
did not exist. A service started with the one token works as before: that token is the admin.

Token files are secrets on disk: created without following links, in a folder no other user can
write, mode 0600, and an existing one is only replaced if it is this user's own regular file.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import stat
import threading

from starlette.responses import JSONResponse

from cadence.sandbox.models import SandboxError

ADMIN = "admin"
CLIENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
DEFAULT_MAX_BODY_MB = 20  # a 16 MiB read's worth of base64 (21.3 MB) does not fit: writes take 15 MiB


class AdminOnly(SandboxError):
    """A call only the admin token may make (HTTP 403)."""


class UnsafeTokenPath(ValueError):
    """A token file in a folder another user can write, or a planted file or link."""


def _check_folder(folder: str, what: str) -> None:
    st = os.lstat(folder)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafeTokenPath(f"{what}: {folder} is not a plain folder (a link?); use a private folder "
                              "such as ~/.cadence/sandbox")
    if st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o022:
        raise UnsafeTokenPath(f"{what}: {folder} can be written by other users; use a private folder "
                              "such as ~/.cadence/sandbox (mode 0700)")


def _check_existing(path: str, what: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        kind = "a link" if stat.S_ISLNK(st.st_mode) else "not a regular file" if not stat.S_ISREG(st.st_mode) \
            else f"owned by uid {st.st_uid}"
        raise UnsafeTokenPath(f"{what}: {path} exists and is {kind}; remove it, or choose another path")


def write_secret(path: str, text: str, what: str = "--token-file") -> None:
    """Write `text` to `path` as a private file (0600): never through a link, never into a folder
    others can write, never over a file that is not this user's own."""
    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    _check_folder(folder, what)
    _check_existing(path, what)
    tmp = f"{path}.{secrets.token_hex(6)}.tmp"
    # O_EXCL|O_NOFOLLOW: a fresh file of ours, whatever was planted at that name meanwhile.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)  # a rename replaces a link itself, never what it points to
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_token(path: str, token: str | None = None) -> str:
    """A fresh token (or the given one: services that share clients share a token) in a private
    file (write_secret)."""
    token = token or secrets.token_urlsafe(32)
    write_secret(path, token + "\n")
    return token


def _digest(token: str | bytes) -> bytes:
    return hashlib.sha256(token.encode() if isinstance(token, str) else token).digest()


class Clients:
    """Tokens by client name, looked up by their SHA-256 (the admin's included); issued client
    tokens are saved to `path` (name and token per line) when one is given."""

    def __init__(self, admin_token: str, path: str | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._tokens: dict[str, str] = {}  # name -> token (client tokens only)
        self._scopes: dict[str, str] = {}  # name -> the one sandbox id its token may reach
        self._by_digest = {_digest(admin_token): ADMIN}
        if path and os.path.exists(path):
            self._load(path)

    def _load(self, path: str) -> None:
        _check_folder(os.path.dirname(os.path.abspath(path)), "--clients-file")
        _check_existing(path, "--clients-file")
        if stat.S_IMODE(os.stat(path).st_mode) & 0o077:
            raise UnsafeTokenPath(f"--clients-file: {path} can be read by other users; chmod 600 it")
        with open(path) as f:
            for n, line in enumerate(f, 1):
                line = line.split("#", 1)[0].strip()
                if not line:
                    continue
                name, _, token = line.partition(" ")
                token = token.strip()
                if not CLIENT_NAME.fullmatch(name) or name == ADMIN or len(token) < 16:
                    raise ValueError(f"--clients-file {path}:{n}: expected '<name> <token>' (name "
                                     f"{CLIENT_NAME.pattern}, not {ADMIN!r}; token 16 characters or more)")
                self._tokens[name] = token
        self._by_digest.update({_digest(t): n for n, t in self._tokens.items()})

    def who(self, token: bytes) -> str | None:
        """The client a bearer token belongs to, or None."""
        return self._by_digest.get(_digest(token))

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._tokens)

    def issue(self, name: str, sandbox_id: str | None = None) -> str:
        """A fresh token for `name` (replacing its old one). With `sandbox_id`, the token reaches
        that one sandbox only (`allows`), and lasts as long as this process (never saved)."""
        if not CLIENT_NAME.fullmatch(name) or name == ADMIN:
            raise ValueError(f"client name {name!r}: use letters, digits, '_', '.', '-' (64 at most), not {ADMIN!r}")
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._forget(name)
            self._tokens[name] = token
            self._by_digest[_digest(token)] = name
            if sandbox_id is not None:
                self._scopes[name] = sandbox_id
            self._save()
        return token

    def allows(self, client: str, method: str, path: str) -> bool:
        """Whether `client` may make this call: a scoped token only its sandbox's info, calls and
        files (not stopping it, creating others, or anything else)."""
        sandbox_id = self._scopes.get(client)
        if sandbox_id is None:
            return True
        base = f"/v1/sandboxes/{sandbox_id}"
        return (path == base and method == "GET") or path.startswith(base + "/")

    def revoke(self, name: str) -> bool:
        with self._lock:
            known = self._forget(name)
            self._save()
        return known

    def _forget(self, name: str) -> bool:
        old = self._tokens.pop(name, None)
        self._scopes.pop(name, None)
        if old is not None:
            self._by_digest.pop(_digest(old), None)
        return old is not None

    def _save(self) -> None:
        if self.path:
            lines = "".join(f"{n} {t}\n" for n, t in sorted(self._tokens.items()) if n not in self._scopes)
            write_secret(self.path, "# cadence sandbox client tokens: <name> <token>\n" + lines, "--clients-file")


def owner_filter(request) -> str | None:
    """The owner a caller's view is limited to (BearerAuth put its client name on the request):
    its own name; None (every sandbox) for the admin."""
    client = request.state.client
    return None if client == ADMIN else client


class BearerAuth:
    """Checks the token before routing and body parsing: a call without a known one does nothing
    at all; a known one's client name goes to `request.state.client`. Plain ASGI (not
    @app.middleware, which wraps every request in extra tasks and streams)."""

    def __init__(self, app, clients: Clients) -> None:
        self.app, self.clients = app, clients

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            got = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            client = self.clients.who(got[7:]) if got.startswith(b"Bearer ") else None
            if client is None:
                deny = JSONResponse({"detail": "missing or wrong bearer token (Authorization: Bearer <token>)"},
                                    status_code=401, headers={"WWW-Authenticate": "Bearer"})
                await deny(scope, receive, send)
                return
            if not self.clients.allows(client, scope["method"], scope["path"]):
                deny = JSONResponse({"detail": "this token reaches one sandbox only: its GET, /exec and /files"},
                                    status_code=403)
                await deny(scope, receive, send)
                return
            scope.setdefault("state", {})["client"] = client
        await self.app(scope, receive, send)
