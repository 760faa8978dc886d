"""Typed limits, requests and results shared by the sandbox, the pool, the service and the SDK."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Limits(BaseModel):
    """Per-sandbox limits. The defaults apply when the caller sets nothing (the hosted services'
    1 GiB / a few hundred processes)."""

    model_config = ConfigDict(extra="forbid")

    memory_mb: int = Field(1024, ge=16, description="address space per process (RLIMIT_AS)")
    processes: int = Field(256, ge=1, description="processes+threads of the sandbox (RLIMIT_NPROC, own uid)")
    open_files: int = Field(256, ge=16, description="open files per process (RLIMIT_NOFILE)")
    file_size_mb: int = Field(64, ge=1, description="largest file a process may write (RLIMIT_FSIZE)")
    disk_mb: int = Field(256, ge=1, description="size of the workspace tmpfs (and of /tmp)")
    cpu_s: float = Field(30.0, gt=0, description="CPU seconds per exec call (RLIMIT_CPU)")
    wall_s: float = Field(30.0, gt=0, description="wall-clock seconds per exec call")


class ExecRequest(BaseModel):
    """Run a command (argv list or shell string) or Python code. `session=True` runs it in one
    of the sandbox's persistent sessions: `code` in the Python session (globals survive across
    calls), `cmd` in the shell session (bash, else sh: the working directory, exported
    variables and functions survive; `env` is exported into it)."""

    model_config = ConfigDict(extra="forbid")

    cmd: list[str] | str | None = None
    code: str | None = None
    stdin: str = ""
    session: bool = False
    timeout_s: float | None = Field(None, gt=0, description="wall clock; default the sandbox's wall_s")
    env: dict[str, str] = Field(default_factory=dict)


class ExecResult(BaseModel):
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    limit: Literal["wall", "cpu", "memory", "file_size"] | None = None
    output_truncated: bool = False
    session_started: bool = False  # this call started a new session (the old one's globals are gone)
    session_lost: bool = False  # the session died or was killed during this call

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.limit is None


class SandboxError(RuntimeError):
    """A request the sandbox could not serve (bad path, dead sandbox, ...): one line."""


class SandboxDied(SandboxError):
    """The sandbox process is gone or stopped answering; its pool replaces it."""


class IsolationUnavailable(SandboxError):
    """bubblewrap is missing or cannot create namespaces on this host."""
