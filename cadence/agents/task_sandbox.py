"""A sandbox for every agent run: acquired before the run, handed to the agent with its task,
released when the run ends however it ends (returned, raised, timed out, cancelled).

    group = await sandboxes.open_group(task, runs=8)  # the task's workspace, prepared once per group
    async with group.run() as sandbox:                # a sandbox already holding a copy of it
        await agent(client, sandbox.task(task))       # task["sandbox"], ["sandbox_url"], ["sandbox_token"]
        after = await sandbox.snapshot()              # the workspace as the run left it (for grading)
    await group.close()

The pool (cadence/sandbox/pool.py) keeps `warm` spares started on the template, so a copy of the
workspace need not wait for a sandbox to start. A group's workspace is seeded once from the row (a
folder or tar under `repo_field`, files under `files_field`), `setup` runs there once, and the
result is read back as a tar (`pristine`, what the grader compares a run's workspace with); that
sandbox is then released. Every run's sandbox gets the pristine state restored into it
(workspace.restore), so the runs of a group start from the same files, and no sandbox of the group
can die and take the state with it. `open_group(runs=n)` restores it into n sandboxes in the
background at once, so the runs find theirs ready (a dequeue); a run past those (a retry, a
grading) gets a copy made then.

Scaffolds in another process or language reach their sandbox over HTTP: the sandbox service's
app (cadence/sandbox/server.py) served on 127.0.0.1 from this process, with a token per run that
reaches that one sandbox only (auth.Clients.issue(sandbox_id=...)), revoked at release.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import secrets
import tarfile
import threading
import uuid
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from cadence.agents.config import TaskSandboxConfig
from cadence.sandbox import workspace
from cadence.sandbox.auth import Clients
from cadence.sandbox.models import ExecRequest, ExecResult, SandboxDied, SandboxError
from cadence.sandbox.pool import Pool, PoolConfig, PoolFull

POOL_FULL_WAIT_S = 0.05  # between tries of an acquire while max_size sandboxes are leased
FORK_TRIES = 3  # spares that died before the workspace was copied in, for one copy

# Keys a run's task gets for its sandbox (and so keys a task row must not have).
SANDBOX_KEYS = ("sandbox", "sandbox_url", "sandbox_token")


class TaskSetupFailed(SandboxError):
    """A task's workspace could not be prepared (a missing repo, a failing setup command)."""


class TaskSandbox:
    """One run's sandbox, as the agent gets it in task["sandbox"]. Paths are relative to the
    workspace (/workspace, the working directory of every command). Each call has a sync form
    and an async one (`a` in front), which runs it in a thread so the agent's loop keeps turning."""

    def __init__(self, pool: Pool, sandbox_id: str, url: str | None = None, token: str | None = None,
                 generation: int | None = None) -> None:
        self.pool, self.id, self.url, self.token = pool, sandbox_id, url, token
        # The generation that holds the task's workspace; a replacement (it died) has the next.
        self.generation = pool.get(sandbox_id).generation if generation is None else generation

    def exec(self, cmd: str | list[str] | None = None, *, code: str | None = None, timeout_s: float | None = None,
             stdin: str = "", env: dict[str, str] | None = None, session: bool = False) -> ExecResult:
        """A shell string or an argv list (`cmd`), or Python `code`; `session=True` keeps the shell's
        working directory and variables (or Python's globals) from call to call."""
        request = ExecRequest(cmd=cmd, code=code, timeout_s=timeout_s, stdin=stdin, env=env or {}, session=session)
        return self.pool.exec(self.id, request)

    def read_file(self, path: str) -> bytes:
        return self.pool.read_file(self.id, path)

    def write_file(self, path: str, data: bytes | str, mode: int | None = None) -> str:
        return self.pool.write_file(self.id, path, data.encode() if isinstance(data, str) else data, mode)

    def upload(self, local_path: str, path: str) -> str:
        """A host file into the workspace."""
        with open(local_path, "rb") as f:
            return self.write_file(path, f.read(), os.stat(local_path).st_mode & 0o777)

    def download(self, path: str, local_path: str) -> None:
        """A workspace file onto the host."""
        with open(local_path, "wb") as f:
            f.write(self.read_file(path))

    async def aexec(self, cmd: str | list[str] | None = None, **kw: Any) -> ExecResult:
        return await asyncio.to_thread(self.exec, cmd, **kw)

    async def aread_file(self, path: str) -> bytes:
        return await asyncio.to_thread(self.read_file, path)

    async def awrite_file(self, path: str, data: bytes | str, mode: int | None = None) -> str:
        return await asyncio.to_thread(self.write_file, path, data, mode)

    async def aupload(self, local_path: str, path: str) -> str:
        return await asyncio.to_thread(self.upload, local_path, path)

    async def adownload(self, path: str, local_path: str) -> None:
        await asyncio.to_thread(self.download, path, local_path)

    def task(self, row: dict, hidden: tuple[str, ...] = ()) -> dict:
        """What the agent gets: the row without its `hidden` fields (the grader's), with this sandbox."""
        return {**{k: v for k, v in row.items() if k not in hidden},
                "sandbox": self, "sandbox_url": self.url, "sandbox_token": self.token}

    async def snapshot(self) -> bytes:
        """The workspace now, as a tar (every process of the sandbox stopped while it is read);
        SandboxDied if the sandbox died during the run (its replacement holds none of its work)."""
        if self.pool.get(self.id).generation != self.generation:
            raise SandboxDied(f"sandbox {self.id} died during the run and was replaced: the run's work is gone")
        return await asyncio.to_thread(workspace.snapshot, self.pool.box(self.id))


class TaskSandboxes:
    """The pool of one producer's runs (started with its first group) and its HTTP door."""

    def __init__(self, cfg: TaskSandboxConfig) -> None:
        self.cfg = cfg
        self.pool: Pool | None = None
        self.service: SandboxService | None = None
        self.leased: set[str] = set()  # every sandbox id acquired and not yet released
        self.counts = {"acquired": 0, "released": 0}
        self._starting = asyncio.Lock()

    async def start(self) -> Pool:
        async with self._starting:
            if self.pool is None:
                templates = {self.cfg.template: self.cfg.warm} if self.cfg.template else {}
                config = PoolConfig(warm=0 if templates else self.cfg.warm, templates=templates,
                                    max_size=self.cfg.max_size, limits=self.cfg.limits, idle_timeout_s=86400)
                self.pool = await asyncio.to_thread(Pool, config)  # starts the first spares
                if self.cfg.http:
                    self.service = await asyncio.to_thread(SandboxService, self.pool)
        return self.pool

    async def acquire(self, template: str | None, owner: str | None = None) -> str:
        """A sandbox id (a warm spare when one is ready); waits while max_size are leased."""
        pool = await self.start()
        while True:
            leasing = asyncio.ensure_future(asyncio.to_thread(pool.acquire, None, True, (), owner, template))
            try:
                info = await asyncio.shield(leasing)
                break
            except PoolFull:
                await asyncio.sleep(POOL_FULL_WAIT_S)
            except asyncio.CancelledError:  # the acquire goes on in its thread: give back what it gets
                leasing.add_done_callback(lambda done: _give_back(pool, done))
                raise
        self.leased.add(info.id)
        self.counts["acquired"] += 1
        return info.id

    async def release(self, sandbox_id: str) -> None:
        """Stops it; shielded, so a cancelled run still releases (the stop runs to its end)."""
        if sandbox_id not in self.leased:
            return
        self.leased.discard(sandbox_id)
        self.counts["released"] += 1
        assert self.pool is not None
        release = asyncio.to_thread(_release_quietly, self.pool, sandbox_id)
        await asyncio.shield(asyncio.ensure_future(release))

    async def open_group(self, row: dict, runs: int = 0) -> TaskGroup:
        """The task's workspace prepared in a sandbox (seeded, then `setup`), read back as a tar,
        and that sandbox released; `runs`: sandboxes to fill with it now, for the runs to come."""
        template = row.get("template") or self.cfg.template
        base = await self.acquire(template)
        try:
            generation = self.pool.get(base).generation
            await asyncio.to_thread(self._prepare, base, row)
            pristine = await asyncio.to_thread(workspace.snapshot, self.pool.box(base))
            if self.pool.get(base).generation != generation:  # replaced, empty, since the setup
                raise SandboxDied(f"sandbox {base} died while the task's workspace was prepared in it")
        finally:
            await self.release(base)
        group = TaskGroup(self, template, pristine)
        group.prefill(runs)
        return group

    def _prepare(self, sandbox_id: str, row: dict) -> None:
        assert self.pool is not None
        box = self.pool.box(sandbox_id)
        repo, files = row.get(self.cfg.repo_field), row.get(self.cfg.files_field)
        if files is not None and not isinstance(files, dict):
            raise TaskSetupFailed(f"task field {self.cfg.files_field!r} must be a mapping {{path: text}}, "
                                  f"got a {type(files).__name__}")
        workspace.seed(box, files=files, tar=repo_tar(repo, self.cfg.repo_field) if repo else None)
        if self.cfg.setup:
            r = self.pool.exec(sandbox_id, ExecRequest(cmd=self.cfg.setup, timeout_s=self.cfg.setup_timeout_s))
            if not r.ok:
                raise TaskSetupFailed(f"agent.sandbox.setup {self.cfg.setup!r} failed: exit {r.exit_code}, "
                                      f"limit {r.limit}: {(r.stderr or r.stdout).strip()[-300:]}")

    async def close(self) -> None:
        """Release what is still leased, stop the HTTP door and the pool."""
        for sandbox_id in list(self.leased):
            await self.release(sandbox_id)
        if self.service is not None:
            await asyncio.to_thread(self.service.stop)
            self.service = None
        if self.pool is not None:
            await asyncio.to_thread(self.pool.close)
            self.pool = None

    def metrics(self) -> dict[str, float]:
        return {"agent/sandboxes_acquired_total": float(self.counts["acquired"]),
                "agent/sandboxes_released_total": float(self.counts["released"]),
                "agent/sandboxes_leased": float(len(self.leased))}


class TaskGroup:
    """A group's prepared workspace (`pristine`, a snapshot tar) and its runs' sandboxes, each
    holding a copy of it: one of those filled ahead (`prefill`) when one is left, else a new one."""

    def __init__(self, sandboxes: TaskSandboxes, template: str | None, pristine: bytes) -> None:
        self.sandboxes, self.template, self.pristine = sandboxes, template, pristine
        self.state = workspace.entries_of(pristine)  # parsed once, restored into each sandbox
        self.copies: deque[asyncio.Future[tuple[str, int]]] = deque()  # filled (or filling), not taken

    @property
    def pool(self) -> Pool:
        assert self.sandboxes.pool is not None
        return self.sandboxes.pool

    def prefill(self, runs: int) -> None:
        """Start filling `runs` sandboxes with the workspace, all at once, in the background."""
        self.copies.extend(asyncio.ensure_future(self._copy()) for _ in range(runs))

    async def fork(self, owner: str | None = None) -> str:
        """A sandbox holding a copy of the prepared workspace, leased to `owner`."""
        sandbox_id, _ = await self._take(owner)
        return sandbox_id

    async def _take(self, owner: str | None) -> tuple[str, int]:
        """(sandbox id, generation): a copy filled ahead (a finished one first), else a new copy.
        One that died since it was filled (replaced in place, empty) is given back and the next taken."""
        while self.copies:
            done = next((c for c in self.copies if c.done()), self.copies[0])
            self.copies.remove(done)
            with contextlib.suppress(SandboxError):
                if (taken := await self._claim(done, owner)) is not None:
                    return taken
        if (taken := await self._claim(asyncio.ensure_future(self._copy()), owner)) is None:
            raise SandboxDied("a sandbox died just after the task's workspace was copied into it")
        return taken

    async def _claim(self, copy: asyncio.Future[tuple[str, int]], owner: str | None) -> tuple[str, int] | None:
        """The copy's sandbox, leased to `owner`; None when it died since it was filled."""
        try:
            sandbox_id, generation = await asyncio.shield(copy)
        except asyncio.CancelledError:
            if copy.cancelled():
                raise SandboxError("the task's group was closed while its runs still asked for sandboxes") from None
            self.copies.appendleft(copy)  # this run was cancelled: the copy stays the group's (close releases it)
            raise
        with contextlib.suppress(SandboxError):  # UnknownSandbox: reaped meanwhile
            if self.pool.get(sandbox_id).generation == generation and self.pool.box(sandbox_id).alive:
                self.pool.lease_to(sandbox_id, owner)
                return sandbox_id, generation
        await self.sandboxes.release(sandbox_id)
        return None

    async def _copy(self) -> tuple[str, int]:
        """A sandbox acquired and the workspace restored in it: (its id, the generation holding it).
        A spare that died meanwhile is given back and another taken (FORK_TRIES in all)."""
        for tries in range(1, FORK_TRIES + 1):
            sandbox_id = await self.sandboxes.acquire(self.template)
            restoring = asyncio.ensure_future(asyncio.to_thread(self._restore, sandbox_id))
            try:
                return sandbox_id, await asyncio.shield(restoring)
            except SandboxError:
                await self.sandboxes.release(sandbox_id)
                if tries == FORK_TRIES:
                    raise
            except BaseException:  # cancelled (the group closed): release once the restore is done
                await asyncio.wait([restoring])
                await self.sandboxes.release(sandbox_id)
                raise
        raise AssertionError("unreachable")

    def _restore(self, sandbox_id: str) -> int:
        generation, box = self.pool.get(sandbox_id).generation, self.pool.box(sandbox_id)
        try:
            workspace.restore(box, self.state)
        except OSError as e:
            if box.alive:
                raise
            raise SandboxDied(f"sandbox {sandbox_id} died while the task's workspace was copied in") from e
        if self.pool.get(sandbox_id).generation != generation or not box.alive:
            raise SandboxDied(f"sandbox {sandbox_id} died while the task's workspace was copied in")
        return generation

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[TaskSandbox]:
        """One run's sandbox, released at the end of the block whatever ends it."""
        service = self.sandboxes.service
        owner = f"run-{uuid.uuid4().hex[:12]}" if service is not None else None
        sandbox_id, generation = await self._take(owner)
        try:
            url = token = None
            if service is not None:
                url, token = service.url(sandbox_id), service.clients.issue(owner, sandbox_id=sandbox_id)
            yield TaskSandbox(self.pool, sandbox_id, url, token, generation)
        finally:
            if service is not None:
                service.clients.revoke(owner)
            await self.sandboxes.release(sandbox_id)

    async def close(self) -> None:
        """Release the copies no run took (those still being filled are stopped first)."""
        copies, self.copies = list(self.copies), deque()
        for copy in copies:
            copy.cancel()
        for done in await asyncio.gather(*copies, return_exceptions=True):
            if isinstance(done, tuple):
                await self.sandboxes.release(done[0])


class SandboxService:
    """The sandbox service's REST app over this pool, on 127.0.0.1 in a thread of its own (so the
    agents' loop does not serve it). Only per-run scoped tokens are issued; the admin token is
    random and never leaves this object."""

    def __init__(self, pool: Pool) -> None:
        import uvicorn

        from cadence.sandbox.server import create_app

        self.clients = Clients(secrets.token_urlsafe(32))
        config = uvicorn.Config(create_app(pool, self.clients), host="127.0.0.1", port=0, log_level="warning",
                                timeout_keep_alive=75)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="task-sandbox-http", daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise SandboxError("the task sandboxes' HTTP service did not start")
            threading.Event().wait(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]

    def url(self, sandbox_id: str) -> str:
        """The sandbox's own address: GET it, POST {url}/exec, POST/GET {url}/files."""
        return f"http://127.0.0.1:{self.port}/v1/sandboxes/{sandbox_id}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def repo_tar(repo: str, field: str) -> bytes:
    """A task's repository as tar bytes: a .tar file as it is, a folder packed (links kept as links)."""
    if not isinstance(repo, str) or not os.path.exists(repo):
        raise TaskSetupFailed(f"task field {field!r}: {repo!r} is not a folder or a tar file on this host")
    if os.path.isfile(repo):
        with open(repo, "rb") as f:
            return f.read()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in sorted(os.listdir(repo)):
            tar.add(os.path.join(repo, name), arcname=name)
    return buf.getvalue()


def _give_back(pool: Pool, leasing: asyncio.Future) -> None:
    if not leasing.cancelled() and leasing.exception() is None:
        threading.Thread(target=_release_quietly, args=(pool, leasing.result().id), daemon=True).start()


def _release_quietly(pool: Pool, sandbox_id: str) -> None:
    with contextlib.suppress(SandboxError):  # already gone (the pool reaped or replaced it away)
        pool.release(sandbox_id, "agent run ended")

