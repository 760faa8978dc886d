"""The sandbox service: a pool behind a FastAPI app with a bearer token.

    python -m cadence.sandbox.server --port 8765      (or: cadence sandbox serve)

Every request needs `Authorization: Bearer <token>`; the admin token is generated at start and
written to a file only its owner can read (default ~/.cadence/sandbox/token); services meant to
share clients take one from $CADENCE_SANDBOX_TOKEN instead. Client tokens (auth.py) see only
their own sandboxes. Bodies over --max-body-mb get 413. Errors come back as
`{"detail": "<one line>"}` with a meaningful status, never a stack trace.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import sys
from typing import Literal

from fastapi import BackgroundTasks, FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from cadence.http_guards import BodyLimit
from cadence.sandbox.auth import (
    ADMIN,
    DEFAULT_MAX_BODY_MB,
    AdminOnly,
    BearerAuth,
    Clients,
    owner_filter,
    write_token,
)
from cadence.sandbox.events import Event
from cadence.sandbox.hosted_env import EnvHost, add_env_routes
from cadence.sandbox.models import ExecRequest, ExecResult, Limits, SandboxDied, SandboxError
from cadence.sandbox.pool import Pool, PoolConfig, PoolFull, SandboxInfo, UnknownSandbox

__all__ = ["create_app", "serve", "write_token"]

DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".cadence", "sandbox")
DEFAULT_PORT = 8765


class CreateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    limits: Limits | None = None
    template: str | None = Field(None, max_length=64, description="a template's name: the root file system (templates.py)")


class WriteFileRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    content: str
    encoding: Literal["utf-8", "base64"] = "utf-8"
    mode: int | None = Field(None, ge=0, le=0o7777)


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


class ClientRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


def client_of(request: Request) -> str:
    return request.state.client


def owned(pool: Pool, sandbox_id: str, request: Request) -> SandboxInfo:
    """The sandbox if this caller may see it (its own; the admin: any), else 404 as if unknown."""
    return pool.get(sandbox_id, owner_filter(request))


def create_app(pool: Pool, token: str | Clients, close_pool_at_shutdown: bool = False,
               max_body_mb: int = DEFAULT_MAX_BODY_MB) -> FastAPI:
    """`token`: the admin token (then no client tokens but those issued later), or the clients."""
    clients = token if isinstance(token, Clients) else Clients(token)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        if close_pool_at_shutdown:  # uvicorn re-raises SIGTERM after shutdown: close here
            pool.close()

    app = FastAPI(title="cadence sandbox service", version="1", lifespan=lifespan)

    app.add_middleware(BodyLimit, max_bytes=max_body_mb << 20, setting="the service's --max-body-mb",
                       advice="send large files in parts")
    app.add_middleware(BearerAuth, clients=clients)  # the outer one: 401 before anything is read

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return JSONResponse({"detail": detail, "error": "ValidationError"}, status_code=422)

    @app.exception_handler(SandboxError)
    async def sandbox_error(request: Request, exc: SandboxError):
        code = (404 if isinstance(exc, UnknownSandbox) else 429 if isinstance(exc, PoolFull)
                else 503 if isinstance(exc, SandboxDied) else 403 if isinstance(exc, AdminOnly) else 400)
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
    def status(request: Request) -> Status:
        return Status(counts=pool.counts(), sandboxes=pool.list(owner_filter(request)), config=pool.cfg)

    @app.post("/v1/sandboxes")
    async def create(request: Request, background: BackgroundTasks, req: CreateRequest | None = None) -> SandboxInfo:
        # A warm spare is taken on the event loop (a lock and one event row: no thread hop);
        # only a cold start goes to a worker thread. The next spare starts after the response.
        limits, template, client = (req.limits if req else None), (req.template if req else None), client_of(request)
        info = pool.acquire_spare(limits, client, template)
        if info is None:
            info = await run_in_threadpool(pool.acquire, limits, False, (), client, template)
        background.add_task(pool.refill)
        return info

    @app.get("/v1/sandboxes")
    def list_(request: Request) -> list[SandboxInfo]:
        return pool.list(owner_filter(request))

    @app.get("/v1/sandboxes/{sandbox_id}")
    def get(request: Request, sandbox_id: str) -> SandboxInfo:
        return owned(pool, sandbox_id, request)

    @app.delete("/v1/sandboxes/{sandbox_id}")
    def stop(request: Request, sandbox_id: str) -> dict:
        owned(pool, sandbox_id, request)
        pool.release(sandbox_id)
        return {"ok": True}

    @app.post("/v1/sandboxes/{sandbox_id}/exec")
    def exec_(request: Request, sandbox_id: str, req: ExecRequest) -> ExecResult:
        owned(pool, sandbox_id, request)
        if (req.cmd is None) == (req.code is None):
            raise SandboxError("exec: give exactly one of cmd or code")
        return pool.exec(sandbox_id, req)

    @app.post("/v1/sandboxes/{sandbox_id}/files")
    def write_file(request: Request, sandbox_id: str, req: WriteFileRequest) -> dict:
        owned(pool, sandbox_id, request)
        data = base64.b64decode(req.content) if req.encoding == "base64" else req.content.encode()
        return {"path": pool.write_file(sandbox_id, req.path, data, req.mode)}

    @app.get("/v1/sandboxes/{sandbox_id}/files")
    def read_file(request: Request, sandbox_id: str, path: str) -> FileContent:
        owned(pool, sandbox_id, request)
        return FileContent(path=path, content=base64.b64encode(pool.read_file(sandbox_id, path)).decode())

    @app.get("/v1/events")
    def events(request: Request, sandbox_id: str | None = None, since_id: int = Query(0, ge=0, le=2**62),
               limit: int = Query(1000, ge=1, le=2**31)) -> list[Event]:
        if owner_filter(request) is not None:  # a client reads its own sandboxes' log only
            if sandbox_id is None:
                raise SandboxError("events: a client token needs ?sandbox_id= (one of its own sandboxes)")
            owned(pool, sandbox_id, request)
        return pool.events.query(sandbox_id, since_id, min(limit, 10000))  # at most 10000 a page

    def admin_only(request: Request) -> None:
        if client_of(request) != ADMIN:
            raise AdminOnly("only the admin token (the service's --token-file) manages client tokens")

    @app.get("/v1/clients")
    def list_clients(request: Request) -> list[str]:
        admin_only(request)
        return clients.names()

    @app.post("/v1/clients")
    def issue_client(request: Request, req: ClientRequest) -> dict:
        admin_only(request)
        try:
            return {"name": req.name, "token": clients.issue(req.name)}
        except ValueError as e:
            raise SandboxError(str(e)) from None

    @app.delete("/v1/clients/{name}")
    def revoke_client(request: Request, name: str) -> dict:
        admin_only(request)
        if not clients.revoke(name):
            raise UnknownSandbox(f"no client {name!r}")
        for info in pool.list(owner=name):  # its sandboxes go with its token
            pool.release(info.id, f"client {name!r} revoked")
        return {"ok": True}

    add_env_routes(app, EnvHost(pool))  # /v1/envs: hosted environments (hosted_env.py)
    return app


def serve(cfg: PoolConfig, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
          token_file: str = os.path.join(DEFAULT_DIR, "token"), clients_file: str | None = None,
          max_body_mb: int = DEFAULT_MAX_BODY_MB) -> None:
    import uvicorn

    try:
        token = write_token(token_file, os.environ.get("CADENCE_SANDBOX_TOKEN"))
        clients = Clients(token, clients_file)
    except (OSError, ValueError) as e:
        sys.exit(f"cadence sandbox serve: {e}")
    # Background threads (spares starting, health probes) hold the GIL in slices of the switch
    # interval; at the default 5 ms one request that hops threads can wait several of them.
    sys.setswitchinterval(0.001)
    pool = Pool(cfg)
    try:
        print(f"cadence sandbox service on http://{host}:{port} (token in {token_file}, events in "
              f"{cfg.events_path})", file=sys.stderr, flush=True)
        # Idle connections outlive the clients' (httpx drops its own after 5 s): a server that closes
        # one first races a request just sent on it, which the client sees as a ReadError.
        uvicorn.run(create_app(pool, clients, close_pool_at_shutdown=True, max_body_mb=max_body_mb), host=host, port=port,
                    log_level="warning", timeout_keep_alive=75)
    finally:
        pool.close()  # (a no-op when the shutdown already closed it)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="cadence sandbox service")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--token-file", default=os.path.join(DEFAULT_DIR, "token"))
    p.add_argument("--clients-file", default=None, help="client tokens, '<name> <token>' per line (mode 0600)")
    p.add_argument("--max-body-mb", type=int, default=DEFAULT_MAX_BODY_MB, help="larger request bodies get 413")
    p.add_argument("--events", default=os.path.join(DEFAULT_DIR, "events.db"))
    p.add_argument("--warm", type=int, default=2)
    p.add_argument("--max-size", type=int, default=64)
    p.add_argument("--health-period-s", type=float, default=2.0)
    p.add_argument("--allow-unisolated", action="store_true")
    p.add_argument("--python", default=None, help="interpreter inside the sandboxes (default: this one)")
    p.add_argument("--python-packages", choices=["site", "none"], default="site",
                   help="site: its site-packages importable, read-only; none: standard library only")
    p.add_argument("--dev-tools", action="store_true", help="show debuggers and compilers (hidden by default)")
    a = p.parse_args(argv)
    serve(PoolConfig(warm=a.warm, max_size=a.max_size, health_period_s=a.health_period_s,
                     allow_unisolated=a.allow_unisolated, events_path=a.events, python=a.python,
                     python_packages=a.python_packages, dev_tools=a.dev_tools),
          a.host, a.port, a.token_file, a.clients_file, a.max_body_mb)


if __name__ == "__main__":
    main()
