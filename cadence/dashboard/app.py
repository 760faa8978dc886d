"""The dashboard's web app: JSON endpoints over run folders and sandbox services, one
server-sent-event stream that pushes what changed, and the static page.

    GET /                                  the page (static/index.html)
    GET /api/runs                          every run: state, error, step, reward, pass@1
    GET /api/runs/{run}                    config, status (with the traceback), summary, checkpoints, errors
    GET /api/runs/{run}/metrics?keys=a,b   per key, steps and values (thinned to max_points);
                          ?match=REGEX   or every key the regular expression finds
    GET /api/runs/{run}/timeline?last_s=   pipeline spans per actor, staleness histogram, alpha
    GET /api/runs/{run}/samples            the newest logged groups
    GET /api/runs/{run}/samples/{step}/{group}   one group's samples, turn by turn, token by token
    GET /api/runs/{run}/rhythm/{step}/{group}/{index}   WAAD, FAI and gamma per token of one sample
                                           (algorithm.credit=local|global|coupled runs; latest checkpoint)
    GET /api/sandboxes                     each sandbox service's sandboxes, failures and events
    GET /api/stream?run=R&rows=N&gen=G     SSE: `runs`, and for run R: `rows` (metric rows past N),
                                           `reset`, `timeline`, `samples`; `sandboxes` when given
"""

from __future__ import annotations

import asyncio
import hmac
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from pydantic_core import to_json

from cadence.dashboard.matching import MATCH_TIMEOUT_S, MatchError
from cadence.dashboard.rhythm import RhythmReader
from cadence.dashboard.runs import RunIndex, RunReader
from cadence.dashboard.sandboxes import SandboxService
from cadence.http_guards import allowed_names, host_allowed

STATIC = Path(__file__).parent / "static"
COOKIE = "cadence_dashboard_token"
HOSTS_ENV = "CADENCE_DASHBOARD_HOSTS"  # more names the dashboard answers to, comma-separated


def plotly_js() -> Path:
    """plotly.js as the `plotly` package ships it: no CDN, no build step."""
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def sse_json(value: Any) -> str:
    """JSON the browser's JSON.parse reads: NaN and infinities (a run file may hold them) become null,
    as in the JSON endpoints."""
    return to_json(value, inf_nan_mode="null").decode()


def create_app(runs_dir: Path, sandboxes: list[SandboxService] | None = None, token: str | None = None,
               poll_s: float = 1.0, hosts: set[str] | None = None,
               match_timeout_s: float = MATCH_TIMEOUT_S) -> FastAPI:
    """`hosts`: the names a request's Host header may carry (default: loopback's, see
    cadence/http_guards.py)."""
    index = RunIndex(Path(runs_dir))
    hosts = allowed_names("127.0.0.1", env=HOSTS_ENV) if hosts is None else hosts
    services = sandboxes or []
    rhythm = RhythmReader()
    app = FastAPI(title="cadence dashboard", docs_url=None, redoc_url=None, openapi_url=None)

    if token:
        @app.middleware("http")
        async def check_token(request: Request, call_next):
            given = (request.query_params.get("token") or request.cookies.get(COOKIE)
                     or request.headers.get("authorization", "").removeprefix("Bearer "))
            if not hmac.compare_digest(given.encode(), token.encode()):
                return JSONResponse({"detail": "open the address printed at start (it carries ?token=...)"},
                                    status_code=401)
            response = await call_next(request)
            if request.query_params.get("token"):
                response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
            return response

    # Added last, so it runs first: a request under a foreign name gets nothing, not even a 401.
    @app.middleware("http")
    async def check_host(request: Request, call_next):
        header = request.headers.get("host")
        server = request.scope.get("server")
        if not host_allowed(header, hosts, server[1] if server else None):
            return JSONResponse({"detail": f"Host {header!r} is not a name of this dashboard (DNS rebinding?); "
                                           "open it as http://127.0.0.1:PORT/, or allow the name with "
                                           f"--allow-host NAME or {HOSTS_ENV}=NAME"}, status_code=421)
        return await call_next(request)

    def reader(name: str) -> RunReader:
        found = index.reader(name)
        if found is None:
            raise HTTPException(404, f"no run {name!r} under {runs_dir}")
        return found

    async def refreshed(name: str, **parts: bool) -> RunReader:
        found = reader(name)
        await asyncio.to_thread(found.refresh, **parts)
        return found

    @app.get("/")
    def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/favicon.ico")
    def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/static/plotly.min.js")
    def plotly() -> FileResponse:
        return FileResponse(plotly_js(), media_type="text/javascript", headers={"Cache-Control": "max-age=86400"})

    @app.get("/static/{name}")
    def static(name: str) -> FileResponse:
        path = STATIC / name
        if "/" in name or not path.is_file():
            raise HTTPException(404, name)
        return FileResponse(path)

    @app.get("/api/runs")
    async def runs() -> list[dict[str, Any]]:
        return await asyncio.to_thread(index.runs)

    @app.get("/api/runs/{name}")
    async def run(name: str) -> dict[str, Any]:
        return await asyncio.to_thread(reader(name).details)

    @app.get("/api/runs/{name}/metrics")
    async def metrics(name: str, keys: str | None = None, match: str | None = None,
                      max_points: int = 2000) -> dict[str, Any]:
        found = await refreshed(name, events=False, samples=False)
        try:  # in a thread: a pattern's search must not hold up the other requests
            return await asyncio.to_thread(found.series, keys.split(",") if keys else None,
                                           max(10, min(max_points, 100000)), match, match_timeout_s)
        except MatchError as err:
            raise HTTPException(400, str(err)) from None

    @app.get("/api/runs/{name}/timeline")
    async def timeline(name: str, last_s: float = 120.0) -> dict[str, Any]:
        return (await refreshed(name, metrics=False, samples=False)).timeline(last_s)

    @app.get("/api/runs/{name}/samples")
    async def samples(name: str, limit: int = 50) -> list[dict[str, Any]]:
        return (await refreshed(name, metrics=False, events=False)).sample_groups(limit)

    @app.get("/api/runs/{name}/samples/{step}/{group_id}")
    async def group(name: str, step: int, group_id: int) -> list[dict[str, Any]]:
        found = (await refreshed(name, metrics=False, events=False)).group(step, group_id)
        if not found:
            raise HTTPException(404, f"step {step} group {group_id} is not in the sample log (any more)")
        return found

    @app.get("/api/runs/{name}/rhythm/{step}/{group_id}/{index}")
    async def sample_rhythm(name: str, step: int, group_id: int, index: int) -> dict[str, Any]:
        found = await group(name, step, group_id)
        if not 0 <= index < len(found):
            raise HTTPException(404, f"step {step} group {group_id} has no sample {index}")
        try:
            return await asyncio.to_thread(rhythm.sample, reader(name).dir, found[index])
        except ValueError as err:
            raise HTTPException(400, str(err)) from None

    @app.get("/api/sandboxes")
    async def sandbox_view() -> list[dict[str, Any]]:
        return [await asyncio.to_thread(s.snapshot) for s in services]

    @app.get("/api/stream")
    async def stream(request: Request, run: str | None = None, rows: int = 0, gen: int = 0) -> StreamingResponse:
        watched = reader(run) if run else None

        async def events():
            last: dict[str, Any] = {}
            cursor, generation = rows, gen
            yield "retry: 2000\n\n"
            while not await request.is_disconnected():
                listing = sse_json(await asyncio.to_thread(index.runs, poll_s / 2))
                if listing != last.get("runs"):
                    last["runs"] = listing
                    yield f"event: runs\ndata: {listing}\n\n"
                if watched is not None:
                    await asyncio.to_thread(watched.refresh, True, watched.events_wanted, watched.samples_wanted)
                    if watched.generation != generation:  # metrics.jsonl was cut back: start over
                        generation, cursor = watched.generation, 0
                        yield f"event: reset\ndata: {sse_json({'gen': generation})}\n\n"
                    if len(watched.rows) > cursor:
                        new = watched.new_rows(cursor)
                        cursor = len(watched.rows)
                        yield f"event: rows\ndata: {sse_json({'gen': generation, 'rows': new})}\n\n"
                    for key, count in (("timeline", watched.span_count), ("samples", watched.sample_count)):
                        if count != last.get(key):
                            last[key] = count
                            yield f"event: {key}\ndata: {count}\n\n"
                if services:
                    snaps = sse_json([await asyncio.to_thread(s.snapshot) for s in services])
                    yield f"event: sandboxes\ndata: {snaps}\n\n"
                try:
                    await asyncio.sleep(poll_s)
                except asyncio.CancelledError:  # the server is shutting down: end the stream quietly
                    return

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return app
