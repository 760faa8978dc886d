"""One sandbox on this host: a bwrap'd agent process and a framed pipe to it.

`LocalSandbox` is stateful: its workspace, background processes and (with `session=True`) a
Python session's globals persist across `exec` calls until `stop()`. Calls are serialised by a
lock. The agent enforces each call's wall clock; if the agent itself does not answer within that
wall clock plus a grace period, the sandbox is killed and `SandboxDied` raised (a pool replaces
it).
"""

from __future__ import annotations

import base64
import json
import marshal
import os
import select
import shutil
import signal
import struct
import subprocess
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from cadence.sandbox import seccomp, staging, templates
from cadence.sandbox.cgroup import SandboxCgroup
from cadence.sandbox.isolation import Mount, launch, write_id_maps
from cadence.sandbox.models import (
    ExecRequest,
    ExecResult,
    IsolationUnavailable,
    Limits,
    SandboxDied,
    SandboxError,
)
from cadence.sandbox.template_root import TemplateRoot


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


# bwrap's --die-with-parent (PR_SET_PDEATHSIG) fires when the *thread* that forked it exits, not
# the process: a sandbox started from a web server's short-lived worker thread would be killed
# when that thread is retired. So every sandbox is forked from this one thread, which lives as
# long as the process.
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-spawner")


def _new_spawner_after_fork() -> None:
    # A forked child (a reward worker) has the executor but not its thread: submit would wait forever.
    global _SPAWNER
    _SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-spawner")


os.register_at_fork(after_in_child=_new_spawner_after_fork)

def _popen(nice: int, stage: list[str], argv: list[str], root: TemplateRoot | None = None, **kw) -> subprocess.Popen:
    """Popen with the spawner thread's nice value set to `nice` for the fork (a child inherits
    its forking thread's priority), then back to 0. `stage`: host paths bwrap reaches through
    this thread's staging mounts (staging.py); `root`: a template's root to mount first."""
    staging.mount_staged(stage)
    me = threading.get_native_id()
    if nice:
        os.setpriority(os.PRIO_PROCESS, me, nice)
    try:
        if root is not None:
            root.mount(argv)
        return subprocess.Popen(argv, **kw)
    except BaseException:
        if root is not None:
            root.release()
        raise
    finally:
        if nice:
            os.setpriority(os.PRIO_PROCESS, me, 0)


BACKGROUND_NICE = 10  # warm spares start at this priority (see LocalSandbox.start)
GRACE_S = 5.0  # beyond the call's own wall clock, before an unanswering agent counts as hung
START_TIMEOUT_S = 30.0
MAX_WAIT_S = 7 * 24 * 3600.0  # a deadline past this is a week: select() overflows on larger ones
FILE_TIMEOUT_S = 10.0  # a file op (16 MiB at most, on a tmpfs) takes milliseconds; past this the agent is hung


class LocalSandbox:
    def __init__(self, limits: Limits | None = None, python: str | None = None,
                 allow_unisolated: bool = False, sandbox_id: str | None = None,
                 python_packages: str = "site", mounts: tuple[Mount, ...] = (), dev_tools: bool = False,
                 template: str | templates.Template | None = None) -> None:
        """`python`: the interpreter inside (None: the one running cadence); `python_packages`:
        "site" (its site-packages importable, read-only) or "none" (standard library only);
        `mounts`: host code shown read-only under /opt/code (hosted environments); `dev_tools`:
        the host's debuggers and compilers too (hidden by default, system_view.py); `template`: a
        template (or its name in the default store) as the root file system (templates.py)."""
        self.id = sandbox_id or uuid.uuid4().hex[:12]
        self.limits = limits or Limits()
        self.python = python
        self.allow_unisolated = allow_unisolated
        self.python_packages = python_packages
        self.mounts = tuple(mounts)
        self.dev_tools = dev_tools
        self.template = templates.resolve(template)
        self.proc: subprocess.Popen | None = None
        self.isolated = False
        self.started_at = 0.0
        self.start_s = 0.0
        self._lock = threading.Lock()
        self._workspace_host: str | None = None
        self.cgroup: SandboxCgroup | None = None
        self.agent_pid: int | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, background: bool = False) -> LocalSandbox:
        """Start the agent. `background=True` (a warm spare nobody waits for) starts it at a low
        CPU priority, so that it does not slow the calls being served; the agent is put back to
        normal priority once up. Only as root, which may raise a priority back."""
        t0 = time.perf_counter()
        spec = launch(self.limits, self.python, self.allow_unisolated, self.python_packages, self.mounts,
                      self.dev_tools, self.template)
        self.isolated, self._workspace_host = spec.isolated, spec.workspace_host
        kw = {"user": spec.user, "group": spec.user, "extra_groups": []} if spec.user is not None else {}
        self._err = tempfile.TemporaryFile()  # a file, not a pipe: nobody must drain it
        filter_fd = seccomp.program_fd(spec.seccomp) if spec.seccomp is not None else None
        # With a uid for user code, bwrap reports its child's pid on one pipe and waits on the
        # other until this host has written the id maps (isolation.write_id_maps).
        info_r, info_w = os.pipe() if spec.code_uid is not None else (None, None)
        block_r, block_w = os.pipe() if spec.code_uid is not None else (None, None)
        passed = tuple(fd for fd in (filter_fd, info_w, block_r) if fd is not None)
        try:
            self.proc = _SPAWNER.submit(
                _popen, BACKGROUND_NICE if background and os.geteuid() == 0 else 0, spec.stage,
                spec.argv_with(filter_fd, info_w, block_r), root=spec.root, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=self._err, start_new_session=True, close_fds=True,
                cwd=spec.workspace_host or "/", pass_fds=passed, **kw,
            ).result()
        finally:
            for fd in passed:
                os.close(fd)
        if spec.code_uid is not None:
            self._map_ids(info_r, block_w, spec.user, spec.code_uid)
        # Into its cgroup before the agent has its source, so before anything in it can fork.
        # Named per process, not per sandbox id: a replacement under the same id must never share
        # a cgroup with its predecessor, whose removal kills what is inside.
        self.cgroup = SandboxCgroup.create(f"{self.id}-{uuid.uuid4().hex[:8]}", self.limits.memory_mb << 20,
                                            self.limits.cpus)
        if self.cgroup is not None:
            self.cgroup.add_tree(self.proc.pid)
        try:
            cfg = marshal.dumps(spec.config, 4)
            self.proc.stdin.write(spec.preamble + struct.pack(">I", len(cfg)) + cfg)
            self.proc.stdin.flush()
            hello = self._recv(time.monotonic() + START_TIMEOUT_S)
        except (SandboxDied, BrokenPipeError) as e:
            err = self._stderr_tail()
            self.stop()
            if self.isolated and err:
                raise IsolationUnavailable(f"bubblewrap could not start a sandbox: {err}") from e
            raise SandboxDied(f"sandbox {self.id} did not start: {err or e}") from e
        finally:
            if spec.root is not None:  # bwrap holds its own reference now (template_root.py)
                _SPAWNER.submit(spec.root.release).result()
        self.pid = hello["pid"]
        self.agent_pid = self.agent_host_pid()
        if background and os.geteuid() == 0 and self.agent_pid is not None:
            os.setpriority(os.PRIO_PROCESS, self.agent_pid, 0)  # its calls run at normal priority
        self.started_at = time.time()
        self.start_s = time.perf_counter() - t0
        return self

    def _map_ids(self, info_r: int, block_w: int, agent_uid: int, code_uid: int) -> None:
        """Read bwrap's child pid from its info pipe, write its id maps, and let it go on. A
        sandbox whose maps could not be written is stopped before anything runs in it."""
        try:
            with os.fdopen(info_r, "rb") as f:
                info = f.read()  # bwrap closes it once written (or exits)
            write_id_maps(json.loads(info)["child-pid"], agent_uid, code_uid)
            os.write(block_w, b"1")
        except (OSError, ValueError, KeyError) as e:
            err = self._stderr_tail()
            self.stop()
            raise IsolationUnavailable(f"bubblewrap could not start a sandbox: {err or e}") from e
        finally:
            os.close(block_w)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def agent_host_pid(self) -> int | None:
        """The agent's pid on the host (bwrap's child), for health checks and fault injection."""
        pid = self.proc.pid if self.proc else None
        for _ in range(4):
            if pid is None or not _cmdline(pid).split(b"\0")[0].endswith(b"bwrap"):
                return pid
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    kids = f.read().split()
            except OSError:
                return None
            pid = int(kids[0]) if kids else None
        return None

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # bwrap and everything in its namespace
            except OSError:
                pass
            proc.kill()
            if self.cgroup is not None:  # a workspace call may hold it frozen: killed, it dies once thawed
                self.cgroup.thaw()
            proc.wait()
            for f in (proc.stdin, proc.stdout):
                f.close()
        cgroup, self.cgroup = self.cgroup, None  # stop() may run twice at once (a call and a health check)
        if cgroup is not None:
            cgroup.remove()
        if getattr(self, "_err", None) is not None:
            self._err.close()
            self._err = None
        if self._workspace_host:
            shutil.rmtree(self._workspace_host, ignore_errors=True)
            self._workspace_host = None

    def __enter__(self) -> LocalSandbox:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- calls ---------------------------------------------------------------------------------
    def exec(self, request: ExecRequest | str | list[str] | None = None, *, code: str | None = None,
             grace_s: float = GRACE_S, **kw: object) -> ExecResult:
        """`exec("ls -l")`, `exec(["python3", "-c", "..."])`, `exec(code="print(1)")`, or an
        ExecRequest; keyword arguments are ExecRequest fields. An agent that has not answered
        `grace_s` after the call's own wall clock counts as hung: the sandbox is killed."""
        if not isinstance(request, ExecRequest):
            request = ExecRequest(cmd=request, code=code, **kw)
        if (request.cmd is None) == (request.code is None):
            raise SandboxError("exec: give exactly one of cmd or code")
        timeout = request.timeout_s or self.limits.wall_s
        if not 0 < timeout < float("inf"):  # nan and inf too: refused before anything runs
            raise SandboxError(f"exec: timeout_s={timeout!r}: give a finite number of seconds > 0")
        cgroup = self.cgroup
        ooms = cgroup.oom_kills() if cgroup is not None else 0
        resp = self._call({
            "op": "exec", "cmd": request.cmd, "code": request.code, "stdin": request.stdin,
            "session": request.session, "env": request.env, "timeout": timeout, "judge": request.judge,
            "cpu_s": min(self.limits.cpu_s, timeout + 1),
        }, timeout, grace=grace_s)
        if resp["limit"] is None and cgroup is not None and cgroup.oom_kills() > ooms:
            resp["limit"] = "memory"  # the kernel killed a process of this sandbox at memory_mb
        return ExecResult(**resp)

    def usage(self) -> dict[str, float | int | None]:
        """CPU seconds, memory (MiB) and processes of the whole sandbox: from its cgroup, None
        without one."""
        cg = self.cgroup
        mem = cg.memory_bytes() if cg is not None else None
        return {"cpu_s": cg.cpu_s() if cg is not None else None,
                "memory_mb": None if mem is None else round(mem / (1 << 20), 1),
                "processes": cg.processes() if cg is not None else None}

    def write_file(self, path: str, data: bytes | str, mode: int | None = None) -> str:
        raw = data.encode() if isinstance(data, str) else data
        return self._call({"op": "write", "path": path, "data": raw, "mode": mode}, FILE_TIMEOUT_S)["path"]

    def read_file(self, path: str, max_bytes: int = 16 << 20) -> bytes:
        return base64.b64decode(self._call({"op": "read", "path": path, "max_bytes": max_bytes}, FILE_TIMEOUT_S)["data"])

    def ping(self, timeout_s: float = 2.0) -> bool:
        try:
            return bool(self._call({"op": "ping"}, timeout_s, grace=0.0).get("ok"))
        except SandboxError:
            return False

    # -- wire ------------------------------------------------------------------------------------
    def _call(self, req: dict, timeout_s: float, grace: float = GRACE_S) -> dict:
        """One request and its reply. Every request carries a fresh id that its reply must echo;
        a call that fails on the way (no answer in time, a broken or foreign frame, a wrong id,
        an error here between the write and the read) stops the sandbox, so no later call can
        read this call's reply as its own: the caller (a pool) starts a fresh one."""
        with self._lock:
            if not self.alive:
                raise SandboxDied(f"sandbox {self.id} is not running")
            call_id = os.urandom(8).hex()
            data = marshal.dumps({**req, "id": call_id}, 4)  # the agent reads marshal; we read its JSON
            try:
                self.proc.stdin.write(struct.pack(">I", len(data)) + data)
                self.proc.stdin.flush()
                resp = self._recv(time.monotonic() + min(timeout_s + grace, MAX_WAIT_S))
                if not isinstance(resp, dict) or resp.pop("id", None) != call_id:
                    raise SandboxDied("a reply that is not this call's (wrong or missing call id)")
            except BaseException as e:
                self.stop()
                if isinstance(e, SandboxDied | BrokenPipeError | ValueError | OverflowError | OSError):
                    raise SandboxDied(f"sandbox {self.id} died or hung: {type(e).__name__}: {e}") from e
                raise
        if "error" in resp:
            raise SandboxError(resp["error"])
        return resp

    def _recv(self, deadline: float) -> dict:
        head = self._read(4, deadline)
        return json.loads(self._read(struct.unpack(">I", head)[0], deadline))

    def _read(self, n: int, deadline: float) -> bytes:
        proc = self.proc
        if proc is None:  # stopped from another thread during the call (a reaper, a test's fault)
            raise SandboxDied("the sandbox was stopped during the call")
        fd = proc.stdout.fileno()
        buf = b""
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxDied("no answer before the deadline")
            if not select.select([fd], [], [], left)[0]:
                continue
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                raise SandboxDied("agent exited")
            buf += chunk
        return buf

    def _stderr_tail(self) -> str:
        if self.proc is None:
            return ""
        try:
            self.proc.wait(timeout=2)
            self._err.seek(0)
            lines = self._err.read().decode(errors="replace").strip().splitlines()
        except (subprocess.TimeoutExpired, ValueError, OSError):
            return ""
        return lines[-1] if lines else ""
