"""Isolated, health-checked, self-healing sandboxes for agent environments and rewards (docs/sandbox.md)."""

from cadence.sandbox.models import (
    ExecRequest,
    ExecResult,
    IsolationUnavailable,
    Limits,
    SandboxDied,
    SandboxError,
)
from cadence.sandbox.sandbox import LocalSandbox

__all__ = ["ExecRequest", "ExecResult", "IsolationUnavailable", "Limits", "LocalSandbox", "SandboxDied", "SandboxError"]
