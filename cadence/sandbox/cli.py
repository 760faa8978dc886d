"""`cadence sandbox ...`: run one command in a fresh sandbox, serve the API, inspect a service."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from cadence.sandbox.models import IsolationUnavailable, Limits, SandboxError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Isolated sandboxes: run a command, serve the sandbox API, list and stop sandboxes.")


@app.callback()
def _group() -> None:
    """Isolated sandboxes: run a command, serve the sandbox API, list and stop sandboxes."""


def _fail(msg: str, code: int = 2) -> None:
    typer.secho(msg, fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


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
    python: Annotated[str | None, typer.Option(help="Interpreter inside the sandbox.")] = None,
    allow_unisolated: Annotated[bool, typer.Option(
        "--allow-unisolated", help="Without bubblewrap, run with rlimits only (NOT isolated).")] = False,
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
                        file_size_mb=file_size_mb, disk_mb=disk_mb, cpu_s=cpu_s, wall_s=wall_s)
    except ValueError as e:
        _fail(f"sandbox run: {e.errors()[0]['loc'][0]}: {e.errors()[0]['msg']}")
    stdin = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
    try:
        with LocalSandbox(limits, python=python, allow_unisolated=allow_unisolated) as sb:
            r = sb.exec(cmd, stdin=stdin)
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
