"""`cadence sandbox ...`: run one command in a fresh sandbox, serve the API, inspect a service."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from cadence.sandbox.models import IsolationUnavailable, Limits, SandboxError
from cadence.sandbox.template_layers import UnpackLimits

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Isolated sandboxes: run a command, serve the sandbox API, list and stop sandboxes.")


@app.callback()
def _group() -> None:
    """Isolated sandboxes: run a command, serve the sandbox API, list and stop sandboxes."""


def _fail(msg: str, code: int = 2) -> None:
    typer.secho(msg, fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


DevToolsOpt = Annotated[bool, typer.Option(
    "--dev-tools", help="Show the host's debuggers and compilers (gdb, gcc, ...), hidden by default.")]


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    memory_mb: Annotated[int, typer.Option(help="Address space per process, MiB.")] = 1024,
    processes: Annotated[int, typer.Option(help="Processes and threads of the sandbox.")] = 256,
    open_files: Annotated[int, typer.Option(help="Open files per process.")] = 256,
    file_size_mb: Annotated[int, typer.Option(help="Largest file a process may write, MiB.")] = 64,
    disk_mb: Annotated[int, typer.Option(help="Size of the workspace (and /tmp), MiB.")] = 256,
    cpu_s: Annotated[float, typer.Option(help="CPU seconds.")] = 30.0,
    wall_s: Annotated[float, typer.Option(help="Wall-clock seconds.")] = 30.0,
    cpus: Annotated[float, typer.Option(help="CPU cores at once, for the whole sandbox (cgroup quota).")] = 1.0,
    python: Annotated[str | None, typer.Option(help="Interpreter inside the sandbox.")] = None,
    python_packages: Annotated[str, typer.Option(
        help="site: the interpreter's site-packages importable (read-only); none: standard library only.")] = "site",
    allow_unisolated: Annotated[bool, typer.Option(
        "--allow-unisolated", help="Without bubblewrap, run with rlimits only (NOT isolated).")] = False,
    template: Annotated[str | None, typer.Option(
        help="Start on this template's root file system (`cadence sandbox template ls`).")] = None,
    dev_tools: DevToolsOpt = False,
) -> None:
    """Run one command in a fresh sandbox: `cadence sandbox run --memory-mb 256 -- python3 -c 'print(1)'`.

    stdin, stdout, stderr and the exit code are passed through; a limit hit is named on stderr.
    """
    from cadence.sandbox.sandbox import LocalSandbox

    cmd = list(ctx.args)
    if not cmd:
        _fail("sandbox run: no command; give one after --, e.g. cadence sandbox run -- python3 -c 'print(1)'")
    try:
        limits = Limits(memory_mb=memory_mb, processes=processes, open_files=open_files,
                        file_size_mb=file_size_mb, disk_mb=disk_mb, cpu_s=cpu_s, wall_s=wall_s, cpus=cpus)
    except ValueError as e:
        _fail(f"sandbox run: {e.errors()[0]['loc'][0]}: {e.errors()[0]['msg']}")
    stdin = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
    try:
        with LocalSandbox(limits, python=python, allow_unisolated=allow_unisolated,
                          python_packages=python_packages, template=template, dev_tools=dev_tools) as sb:
            r = sb.exec(cmd, stdin=stdin)
    except ValueError as e:  # --python-packages
        _fail(f"sandbox run: {e}")
    except SandboxError as e:
        _fail(f"sandbox run: {e}", 3 if isinstance(e, IsolationUnavailable) else 2)
    sys.stdout.write(r.stdout)
    sys.stdout.flush()
    sys.stderr.write(r.stderr)
    if r.limit:
        typer.secho(f"sandbox: {r.limit} limit hit (exit code {r.exit_code})", fg=typer.colors.YELLOW, err=True)
    if r.output_truncated:
        typer.secho("sandbox: output truncated at 1 MiB per stream", fg=typer.colors.YELLOW, err=True)
    raise typer.Exit(r.exit_code if r.exit_code >= 0 else 128 - r.exit_code)


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8765,
    token_file: Annotated[str | None, typer.Option(
        help="Where to write the admin bearer token (mode 0600, in a folder only you can write).")] = None,
    clients_file: Annotated[str | None, typer.Option(
        help="Client tokens, '<name> <token>' per line (mode 0600); `cadence sandbox client add` fills it.")] = None,
    max_body_mb: Annotated[int, typer.Option(help="Larger request bodies get 413.")] = 20,
    events: Annotated[str | None, typer.Option(help="SQLite event log (kept across restarts).")] = None,
    warm: Annotated[int, typer.Option(help="Ready spares kept warm.")] = 2,
    max_size: Annotated[int, typer.Option(help="Leased sandboxes at most.")] = 64,
    health_period_s: Annotated[float, typer.Option(help="Seconds between health checks.")] = 2.0,
    python: Annotated[str | None, typer.Option(help="Interpreter inside the sandboxes (default: this one).")] = None,
    python_packages: Annotated[str, typer.Option(
        help="site: the interpreter's site-packages importable (read-only); none: standard library only.")] = "site",
    allow_unisolated: Annotated[bool, typer.Option(
        "--allow-unisolated", help="Without bubblewrap, run with rlimits only (NOT isolated).")] = False,
    template_warm: Annotated[list[str] | None, typer.Option(
        "--template-warm", help="NAME=N: keep N warm spares on template NAME (repeatable).")] = None,
    dev_tools: DevToolsOpt = False,
) -> None:
    """Serve the sandbox API (FastAPI): a bearer token is generated and written to --token-file."""
    import os

    from cadence.sandbox import server
    from cadence.sandbox.pool import PoolConfig

    try:
        cfg = PoolConfig(warm=warm, max_size=max_size, health_period_s=health_period_s, python=python,
                         python_packages=python_packages, allow_unisolated=allow_unisolated,
                         events_path=events or os.path.join(server.DEFAULT_DIR, "events.db"),
                         templates=_template_warm(template_warm or []), dev_tools=dev_tools)
    except ValueError as e:
        _fail(f"sandbox serve: {e.errors()[0]['loc'][0]}: {e.errors()[0]['msg']}")
    server.serve(cfg, host, port, token_file or os.path.join(server.DEFAULT_DIR, "token"), clients_file, max_body_mb)


def _template_warm(items: list[str]) -> dict[str, int]:
    out = {}
    for item in items:
        name, _, count = item.partition("=")
        if not name or not count.isdigit():
            _fail(f"sandbox serve: --template-warm {item!r}: give NAME=N, e.g. --template-warm sci=4")
        out[name] = int(count)
    return out


UrlOpt = Annotated[str | None, typer.Option("--url", help="Service URL (default $CADENCE_SANDBOX_URL or http://127.0.0.1:8765).")]
TokenOpt = Annotated[str | None, typer.Option("--token-file", help="Token file (default ~/.cadence/sandbox/token).")]


def _http(url: str | None, token_file: str | None):
    import os

    import httpx

    from cadence.sandbox.client import resolve

    if token_file:
        os.environ["CADENCE_SANDBOX_TOKEN_FILE"] = token_file
    try:
        urls, token = resolve(url, None)
    except SandboxError as e:
        _fail(str(e))
    return urls[0], httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _get(url: str | None, token_file: str | None, method: str, path: str, **kw):
    import httpx

    from cadence.sandbox.client_core import raise_for

    base, http = _http(url, token_file)
    try:
        resp = http.request(method, base + path, **kw)
        raise_for(resp)
    except httpx.HTTPError as e:
        _fail(f"cannot reach the sandbox service at {base}: {type(e).__name__}; is `cadence sandbox serve` running?")
    except SandboxError as e:
        _fail(str(e))
    return resp.json()


@app.command("ls")
def ls(url: UrlOpt = None, token_file: TokenOpt = None) -> None:
    """List the service's sandboxes: id, state, generation, calls, replacements, last reason."""
    st = _get(url, token_file, "GET", "/v1/status")
    typer.echo("  ".join(f"{k}={v}" for k, v in st["counts"].items()))
    for s in st["sandboxes"]:
        typer.echo(f"{s['id']}  {s['state']:<9} gen={s['generation']} execs={s['execs']} "
                   f"replaced={s['replacements']} owner={s.get('owner') or '-'}  {s['last_reason']}")


@app.command()
def events(
    url: UrlOpt = None, token_file: TokenOpt = None,
    sandbox: Annotated[str | None, typer.Option(help="Only this sandbox's events.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many (the oldest first).")] = 1000,
) -> None:
    """The event log: every state change with its reason."""
    import time

    params = {"limit": limit, **({"sandbox_id": sandbox} if sandbox else {})}
    for e in _get(url, token_file, "GET", "/v1/events", params=params):
        stamp = time.strftime("%H:%M:%S", time.localtime(e["ts"]))
        typer.echo(f"{stamp}  {e['sandbox_id']}  gen={e['generation']}  {e['state']:<9} {e['reason']}")


@app.command()
def stop(
    sandbox_ids: Annotated[list[str], typer.Argument(help="Sandbox ids (see `cadence sandbox ls`).")],
    url: UrlOpt = None, token_file: TokenOpt = None,
) -> None:
    """Stop sandboxes on the service."""
    for sid in sandbox_ids:
        _get(url, token_file, "DELETE", f"/v1/sandboxes/{sid}")
        typer.echo(f"stopped {sid}")


client_app = typer.Typer(add_completion=False, no_args_is_help=True,
                         help="Client tokens (admin token only): each client sees its own sandboxes.")
app.add_typer(client_app, name="client")


@client_app.command("add")
def client_add(name: Annotated[str, typer.Argument(help="The client's name.")],
               url: UrlOpt = None, token_file: TokenOpt = None) -> None:
    """Issue a token for NAME (a new one replaces its old one); printed once, give it to the client."""
    typer.echo(_get(url, token_file, "POST", "/v1/clients", json={"name": name})["token"])


@client_app.command("ls")
def client_ls(url: UrlOpt = None, token_file: TokenOpt = None) -> None:
    """The clients that hold a token."""
    for name in _get(url, token_file, "GET", "/v1/clients"):
        typer.echo(name)


@client_app.command("rm")
def client_rm(name: Annotated[str, typer.Argument(help="The client's name.")],
              url: UrlOpt = None, token_file: TokenOpt = None) -> None:
    """Revoke NAME's token and stop its sandboxes."""
    _get(url, token_file, "DELETE", f"/v1/clients/{name}")
    typer.echo(f"revoked {name}")


template_app = typer.Typer(add_completion=False, no_args_is_help=True,
                           help="Templates: named, cached root file systems a sandbox can start from.")
app.add_typer(template_app, name="template")
StoreOpt = Annotated[str | None, typer.Option(
    "--store", help="Template store (default $CADENCE_TEMPLATE_DIR or ~/.cadence/sandbox/templates).")]


def _store(store: str | None, unpack: UnpackLimits | None = None):
    from cadence.sandbox.templates import TemplateStore

    return TemplateStore(store, unpack)


@template_app.command("build")
def template_build(
    name: Annotated[str, typer.Argument(help="The template's name.")],
    from_dir: Annotated[str | None, typer.Option("--from-dir", help="A folder: its copy is the root.")] = None,
    from_image: Annotated[str | None, typer.Option(
        "--from-image", help="An OCI image archive: `docker save` tar, or an OCI layout (folder or tar).")] = None,
    debian: Annotated[list[str] | None, typer.Option(
        "--debian", help="Debian packages (mmdebstrap; python3 is always in). Repeat, or comma-separate.")] = None,
    pip: Annotated[list[str] | None, typer.Option("--pip", help="pip requirements installed into a --debian root.")] = None,
    suite: Annotated[str, typer.Option(help="Debian suite for --debian.")] = "bookworm",
    mirror: Annotated[str | None, typer.Option(help="Debian mirror for --debian.")] = None,
    max_mb: Annotated[int, typer.Option(min=1, help="--from-image/--from-dir: MiB of files it may write.")] = (
        UnpackLimits.model_fields["max_mb"].default),
    max_entries: Annotated[int, typer.Option(min=1, help="--from-image/--from-dir: tar entries (files) it may have.")] = (
        UnpackLimits.model_fields["max_entries"].default),
    store: StoreOpt = None,
) -> None:
    """Build (or find cached) a template from exactly one of --from-dir, --from-image, --debian."""
    if sum(x is not None for x in (from_dir, from_image, debian)) != 1:
        _fail("template build: give exactly one of --from-dir, --from-image, --debian")
    if pip and debian is None:
        _fail("template build: --pip needs --debian (pip requirements are installed into a Debian root)")
    try:
        s = _store(store, UnpackLimits(max_mb=max_mb, max_entries=max_entries))
        if from_dir is not None:
            t = s.build_from_dir(name, from_dir)
        elif from_image is not None:
            t = s.build_from_image(name, from_image)
        else:
            pkgs = [p for item in debian for p in item.split(",") if p]
            t = s.build_debian(name, pkgs, list(pip or []), suite=suite, mirror=mirror)
    except SandboxError as e:
        _fail(f"template build: {e}", 3 if isinstance(e, IsolationUnavailable) else 2)
    typer.echo(f"{t.name}  {t.key}  {t.size_mb} MiB  {t.source}")


@template_app.command("ls")
def template_ls(store: StoreOpt = None) -> None:
    """The templates: name, content key, size, python inside (or the host's), source."""
    for t in _store(store).ls():
        typer.echo(f"{t.name}  {t.key}  {t.size_mb} MiB  python={t.python or 'host'}  {t.source}")


@template_app.command("rm")
def template_rm(name: Annotated[str, typer.Argument(help="The template's name.")], store: StoreOpt = None) -> None:
    """Forget NAME; its files go when no other name uses them."""
    try:
        _store(store).rm(name)
    except SandboxError as e:
        _fail(f"template rm: {e}")
    typer.echo(f"removed {name}")
