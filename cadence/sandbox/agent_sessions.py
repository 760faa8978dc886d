"""The sandbox agent's persistent sessions: a Python session (globals kept across calls) and a
shell session (bash, else sh: working directory, variables and functions kept), each a long-lived
forked child of the agent.

Part of the agent (agent.py): standard library only, sent into the sandbox with it.
"""

import _signal as signal
import io
import os
import sys

from cadence.sandbox.agent_base import (
    CFG,
    apply_cpu,
    apply_limits,
    become_user,
    high_fds,
    kill_group,
    recv,
    run_code,
    send,
)


class Session:
    """A long-lived forked child that keeps its state across calls: a Python session (globals)
    or a shell (working directory, variables, functions)."""

    def __init__(self, shell: bool = False) -> None:
        cin_r, self.cin = os.pipe()
        self.cout, cout_w = os.pipe()
        self.out, out_w = os.pipe()
        self.err, err_w = os.pipe()
        self.shell = shell
        self.pid = os.fork()
        if self.pid == 0:
            try:
                (shell_child if shell else session_child)(cin_r, cout_w, out_w, err_w)
            finally:
                os._exit(1)
        for fd in (cin_r, cout_w, out_w, err_w):
            os.close(fd)

    def close(self) -> None:
        for fd in (self.cin, self.cout, self.out, self.err):
            os.close(fd)
        kill_group(self.pid)


def session_child(cin_r: int, cout_w: int, out_w: int, err_w: int) -> None:
    null = os.open("/dev/null", os.O_RDONLY)
    os.setsid()
    for target, fd in enumerate(high_fds(null, out_w, err_w, cin_r, cout_w)):
        os.dup2(fd, target)
    os.closerange(5, 1 << 16)
    os.chdir(CFG["workspace"])
    apply_limits(None)
    become_user()
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the agent ignores it; code must not
    os.environ.clear()
    os.environ.update(CFG["env"])
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
    while True:
        req = recv(3)
        if req is None:
            os._exit(0)
        sys.stdin = io.StringIO(req.get("stdin") or "")
        apply_cpu(req["cpu_s"])
        code = run_code(req["code"])
        send(4, {"exit_code": code})


def shell_child(cin_r: int, cout_w: int, out_w: int, err_w: int) -> None:
    """The shell session: commands on fd 0 (one line per call, see shell_call), output on 1 and
    2, and each call's exit status as a line on fd 3."""
    os.setsid()
    for target, fd in enumerate(high_fds(cin_r, out_w, err_w, cout_w)):
        os.dup2(fd, target)
    os.closerange(4, 1 << 16)
    os.chdir(CFG["workspace"])
    apply_limits(None)
    become_user()
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
    os.execve(shell, [shell, "--norc", "--noprofile"] if shell.endswith("bash") else [shell], CFG["env"])


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def shell_call(s: Session, req: dict) -> None:
    """Send one call to the shell session. The command goes through a file and is sourced (`.`),
    so cd, variables and functions stay in the shell; its stdin comes from a file, so a command
    that reads stdin cannot eat the shell's own command stream."""
    cmd = req["cmd"] if isinstance(req["cmd"], str) else " ".join(map(_quote, req["cmd"]))
    env = "".join(f"export {k}={_quote(v)}\n" for k, v in (req.get("env") or {}).items() if k.isidentifier())
    cmd_file, in_file = (os.path.join(CFG["workspace"], name) for name in (".cadence_shell_cmd", ".cadence_shell_in"))
    with open(cmd_file, "w") as f:
        f.write(env + cmd + "\n")
    with open(in_file, "w") as f:
        f.write(req.get("stdin") or "")
    os.write(s.cin, f". {_quote(cmd_file)} < {_quote(in_file)}; printf '%d\\n' \"$?\" >&3\n".encode())


def read_status_line(fd: int) -> dict | None:
    """The shell's `printf '%d\\n' $?` (one short write, so one read)."""
    line = os.read(fd, 64).strip()
    return {"exit_code": int(line)} if line else None
