"""The sandbox service: a pool behind a FastAPI app with a bearer token.

    python -m cadence.sandbox.server --port 8765      (or: cadence sandbox serve)

Every request needs `Authorization: Bearer <token>`; the token is generated at start and written
to a file only its owner can read (default ~/.cadence/sandbox/token); services meant to share
clients take one from $CADENCE_SANDBOX_TOKEN instead. Errors come back as
`{"detail": "<one line>"}` with a meaningful status, never a stack trace.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hmac
import os
import secrets
import sys
from typing import Literal

from fastapi import BackgroundTasks, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from cadence.sandbox.events import Event
from cadence.sandbox.hosted_env import EnvHost, add_env_routes
from cadence.sandbox.models import ExecRequest, ExecResult, Limits, SandboxDied, SandboxError
from cadence.sandbox.pool import Pool, PoolConfig, PoolFull, SandboxInfo, UnknownSandbox

DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".cadence", "sandbox")
DEFAULT_PORT = 8765


class CreateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    limits: Limits | None = None


class WriteFileRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    content: str
    encoding: Literal["utf-8", "base64"] = "utf-8"
    mode: int | None = None


class FileContent(BaseModel):
    path: str
    content: str  # base64
    encoding: Literal["base64"] = "base64"


class Health(BaseModel):
    ok: bool
    counts: dict[str, int]
    isolated: bool | None


class Status(BaseModel):
    counts: dict[str, int]
    sandboxes: list[SandboxInfo]
    config: PoolConfig


class BearerAuth:
    """Checks the token before routing and body parsing: a call without it does nothing at all.
    Plain ASGI (not @app.middleware, which wraps every request in extra tasks and streams)."""

    def __init__(self, app, token: str) -> None:
        self.app, self.expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            got = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not hmac.compare_digest(got, self.expected):
                deny = JSONResponse({"detail": "missing or wrong bearer token (Authorization: Bearer <token>)"},
                                    status_code=401, headers={"WWW-Authenticate": "Bearer"})
                await deny(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(pool: Pool, token: str, close_pool_at_shutdown: bool = False) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        if close_pool_at_shutdown:  # uvicorn re-raises SIGTERM after shutdown: close here
            pool.close()

    app = FastAPI(title="cadence sandbox service", version="1", lifespan=lifespan)

    app.add_middleware(BearerAuth, token=token)

    @app.exception_handler(SandboxError)
    async def sandbox_error(request: Request, exc: SandboxError):
        code = (404 if isinstance(exc, UnknownSandbox) else 429 if isinstance(exc, PoolFull)
                else 503 if isinstance(exc, SandboxDied) else 400)
        return JSONResponse({"detail": str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                             "error": type(exc).__name__}, status_code=code)

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception):
        return JSONResponse({"detail": f"internal error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                             "error": "InternalError"}, status_code=500)

    @app.get("/v1/health")
    def health() -> Health:
        infos = pool.list()
        return Health(ok=True, counts=pool.counts(), isolated=infos[0].isolated if infos else None)

    @app.get("/v1/status")
    def status() -> Status:
        return Status(counts=pool.counts(), sandboxes=pool.list(), config=pool.cfg)

    @app.post("/v1/sandboxes")
    async def create(background: BackgroundTasks, req: CreateRequest | None = None) -> SandboxInfo:
        # A warm spare is taken on the event loop (a lock and one event row: no thread hop);
        # only a cold start goes to a worker thread. The next spare starts after the response.
        limits = req.limits if req else None
        info = pool.acquire_spare(limits)
        if info is None:
            info = await run_in_threadpool(pool.acquire, limits, False)
        background.add_task(pool.refill)
        return info

    @app.get("/v1/sandboxes")
    def list_() -> list[SandboxInfo]:
        return pool.list()

    @app.get("/v1/sandboxes/{sandbox_id}")
    def get(sandbox_id: str) -> SandboxInfo:
        return pool.get(sandbox_id)

    @app.delete("/v1/sandboxes/{sandbox_id}")
    def stop(sandbox_id: str) -> dict:
        pool.release(sandbox_id)
        return {"ok": True}

    @app.post("/v1/sandboxes/{sandbox_id}/exec")
    def exec_(sandbox_id: str, req: ExecRequest) -> ExecResult:
        if (req.cmd is None) == (req.code is None):
            raise SandboxError("exec: give exactly one of cmd or code")
        return pool.exec(sandbox_id, req)

    @app.post("/v1/sandboxes/{sandbox_id}/files")
    def write_file(sandbox_id: str, req: WriteFileRequest) -> dict:
        data = base64.b64decode(req.content) if req.encoding == "base64" else req.content.encode()
        return {"path": pool.write_file(sandbox_id, req.path, data, req.mode)}

    @app.get("/v1/sandboxes/{sandbox_id}/files")
    def read_file(sandbox_id: str, path: str) -> FileContent:
        return FileContent(path=path, content=base64.b64encode(pool.read_file(sandbox_id, path)).decode())

    @app.get("/v1/events")
    def events(sandbox_id: str | None = None, since_id: int = 0, limit: int = 1000) -> list[Event]:
        return pool.events.query(sandbox_id, since_id, min(limit, 10000))

    add_env_routes(app, EnvHost(pool))  # /v1/envs: hosted environments (hosted_env.py)
    return app


def write_token(path: str, token: str | None = None) -> str:
    """A fresh token (or the given one: services that share clients share a token) in a file
    only its owner can read (mode 0600, folder 0700)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    token = token or secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def serve(cfg: PoolConfig, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
          token_file: str = os.path.join(DEFAULT_DIR, "token")) -> None:
    import uvicorn

    token = write_token(token_file, os.environ.get("CADENCE_SANDBOX_TOKEN"))
    # Background threads (spares starting, health probes) hold the GIL in slices of the switch
    # interval; at the default 5 ms one request that hops threads can wait several of them.
    sys.setswitchinterval(0.001)
    pool = Pool(cfg)
    try:
        print(f"cadence sandbox service on http://{host}:{port} (token in {token_file}, events in "
              f"{cfg.events_path})", file=sys.stderr, flush=True)
        # Idle connections outlive the clients' (httpx drops its own after 5 s): a server that closes
        # one first races a request just sent on it, which the client sees as a ReadError.
        uvicorn.run(create_app(pool, token, close_pool_at_shutdown=True), host=host, port=port,
                    log_level="warning", timeout_keep_alive=75)
    finally:
        pool.close()  # (a no-op when the shutdown already closed it)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="cadence sandbox service")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--token-file", default=os.path.join(DEFAULT_DIR, "token"))
    p.add_argument("--events", default=os.path.join(DEFAULT_DIR, "events.db"))
    p.add_argument("--warm", type=int, default=2)
    p.add_argument("--max-size", type=int, default=64)
    p.add_argument("--health-period-s", type=float, default=2.0)
    p.add_argument("--allow-unisolated", action="store_true")
    p.add_argument("--python", default=None, help="interpreter inside the sandboxes (default: this one)")
    p.add_argument("--python-packages", choices=["site", "none"], default="site",
                   help="site: its site-packages importable, read-only; none: standard library only")
    a = p.parse_args(argv)
    serve(PoolConfig(warm=a.warm, max_size=a.max_size, health_period_s=a.health_period_s,
                     allow_unisolated=a.allow_unisolated, events_path=a.events, python=a.python,
                     python_packages=a.python_packages),
          a.host, a.port, a.token_file)


if __name__ == "__main__":
    main()
