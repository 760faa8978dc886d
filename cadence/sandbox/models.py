"""Typed limits, requests and results shared by the sandbox, the pool, the service and the SDK."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Upper bounds of every numeric field a client may send: finite (no inf/nan), and small enough
# that the host's arithmetic on them (deadlines, byte counts, rlimits) cannot overflow.
MAX_SECONDS = 86_400.0  # a day: timeouts and CPU seconds
MAX_MB = 1 << 20  # a TiB: memory, disk and file sizes
MAX_COUNT = 1 << 16  # processes, open files


class Limits(BaseModel):
    """Per-sandbox limits. The defaults apply when the caller sets nothing (the hosted services'
    1 GiB / a few hundred processes)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    memory_mb: int = Field(1024, ge=16, le=MAX_MB, description="address space per process (RLIMIT_AS); the whole sandbox's with a cgroup")
    processes: int = Field(256, ge=1, le=MAX_COUNT, description="processes+threads of the sandbox (RLIMIT_NPROC, own uid)")
    open_files: int = Field(256, ge=16, le=MAX_COUNT, description="open files per process (RLIMIT_NOFILE)")
    file_size_mb: int = Field(64, ge=1, le=MAX_MB, description="largest file a process may write (RLIMIT_FSIZE)")
    disk_mb: int = Field(256, ge=1, le=MAX_MB, description="size of the workspace tmpfs (and of /tmp)")
    cpu_s: float = Field(30.0, gt=0, le=MAX_SECONDS, description=(
        "CPU seconds per exec call: RLIMIT_CPU per process, and the whole sandbox's CPU from a call's "
        "start to the next call's (background processes included; the pool replaces a sandbox past it)"))
    wall_s: float = Field(30.0, gt=0, le=MAX_SECONDS, description="wall-clock seconds per exec call")
    cpus: float = Field(1.0, ge=0.01, le=1024, description="CPU cores the whole sandbox may use at once (cgroup cpu quota)")


class ExecRequest(BaseModel):
    """Run a command (argv list or shell string) or Python code. `session=True` runs it in one
    of the sandbox's persistent sessions: `code` in the Python session (globals survive across
    calls), `cmd` in the shell session (bash, else sh: the working directory, exported
    variables and functions survive; `env` is exported into it)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    cmd: list[str] | str | None = None
    code: str | None = None
    stdin: str = ""
    session: bool = False
    timeout_s: float | None = Field(None, gt=0, le=MAX_SECONDS, description="wall clock; default the sandbox's wall_s")
    env: dict[str, str] = Field(default_factory=dict)
    judge: bool = Field(False, description=(
        "run this one-shot call at the agent's uid, not user code's: for a harness that judges user "
        "code it starts itself (as the user: the uid in $CADENCE_SANDBOX_CODE_ID, where the sandbox has "
        "one of its own), which then cannot signal, ptrace or read it. Never for user code"))

    @model_validator(mode="after")
    def _judge_one_shot(self) -> ExecRequest:
        if self.judge and self.session:
            raise ValueError("judge=True runs a one-shot call; a session is always user code's (drop session)")
        return self


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
