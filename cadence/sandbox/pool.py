"""A self-healing pool of sandboxes: warm spares, lifecycle states, health checks, replacement.

States: starting -> ready (a warm spare) -> busy (leased to a client) -> stopping -> dead, and
unhealthy for one that failed a check (it is replaced). A health thread, every
`health_period_s`, checks liveness of every sandbox and runs the probe in every idle one; a dead,
hung (no answer within `probe_timeout_s`) or failing (wrong probe output) sandbox is replaced:
a spare by a new spare, a leased one in place, under the same id with the next generation
(its files and session are lost, which the exec that hit it reports). Leases unused for
`idle_timeout_s` are reaped. Every state change goes to the event log with its reason.

CPU budget: a call may use `cpu_s` CPU seconds, counted for the whole sandbox (cgroup, else /proc)
from the call's start until the next call starts, so background processes a call left running
(`server &`) count against that call. A sandbox still using CPU after its call ended and past
that budget is replaced by the health thread (reason `cpu: ...`); with a cgroup it can use at
most `cpus` cores meanwhile. A process that re-forks to dodge its own RLIMIT_CPU so stops.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cadence.sandbox import cgroup
from cadence.sandbox.events import EventLog
from cadence.sandbox.isolation import Mount, reap_orphans
from cadence.sandbox.models import (
    MAX_COUNT,
    MAX_SECONDS,
    ExecRequest,
    ExecResult,
    Limits,
    SandboxDied,
    SandboxError,
)
from cadence.sandbox.sandbox import LocalSandbox
from cadence.sandbox.templates import Template

STATES = ("starting", "ready", "busy", "unhealthy", "stopping", "dead")
# Forks a child, writes to the workspace, runs Python: what every call needs.
PROBE_CODE = "open('.cadence_probe', 'w').write('42'); print(open('.cadence_probe').read())"
CPU_SLACK_S = 0.5  # the agent's own CPU for a call (fork, reply, sweep) on top of cpu_s
BACKGROUND_CPU_S = 0.05  # CPU used after a call ended that says something still runs


class PoolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min_size: int = Field(0, ge=0, le=MAX_COUNT, description="sandboxes kept alive at least (spares fill the gap)")
    max_size: int = Field(64, ge=1, le=MAX_COUNT, description="leased sandboxes at most (warm spares come on top)")
    warm: int = Field(2, ge=0, le=MAX_COUNT, description="ready spares kept, so an acquire need not cold-start")
    health_period_s: float = Field(2.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    probe_timeout_s: float = Field(5.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    idle_timeout_s: float = Field(600.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False,
                                  description="a lease with no call this long is reaped")
    limits: Limits = Field(default_factory=Limits)
    python: str | None = Field(
        None, description="interpreter inside the sandboxes (None: the one running cadence), shown "
        "read-only at /opt/python; as root, one under a private folder (a pyenv in /root) is staged")
    python_packages: Literal["site", "none"] = Field(
        "site", description="'site': the interpreter's site-packages importable, read-only (what "
        "E2B or SandboxFusion users expect: numpy and friends); 'none': standard library only")
    allow_unisolated: bool = False
    dev_tools: bool = Field(
        False, description="show the host's /usr whole, debuggers and compilers included (gdb, gcc, ...); "
        "by default they are hidden (system_view.py). A template with its own system shows its own /usr")
    events_path: str = ":memory:"
    templates: dict[str, int] = Field(
        default_factory=dict, description="warm spares kept per template name (templates.py), on top of "
        "`warm` on the host's root; acquire(template=NAME) takes one")


class SandboxInfo(BaseModel):
    id: str
    state: str
    generation: int
    created_at: float
    last_used: float
    execs: int
    replacements: int
    last_reason: str
    limits: Limits
    isolated: bool
    pid: int | None = Field(None, description="the agent's host pid (None while starting)")
    cpu_s: float | None = Field(None, description="CPU seconds used by this generation (cgroup; None without)")
    memory_mb: float | None = Field(None, description="memory held now, files in its tmpfs included (cgroup)")
    processes: int | None = Field(None, description="processes now, bwrap's included (cgroup)")
    owner: str | None = Field(None, description="the client that leased it (None: a spare, or the pool's own)")
    template: str | None = Field(None, description="the template it runs on (None: the host's root)")


class PoolFull(SandboxError):
    """max_size sandboxes are alive: release one, or raise max_size."""


class UnknownSandbox(SandboxError):
    """No sandbox with this id (never existed, released, or reaped)."""


class Slot:
    """One sandbox id's record; `box` is its current process (replaced on failure)."""

    def __init__(self, box: LocalSandbox, state: str, spare: bool) -> None:
        self.box, self.id, self.state = box, box.id, state
        self.generation, self.execs, self.replacements = 0, 0, 0
        self.created_at = self.last_used = time.time()
        self.last_reason = ""
        self.in_call = 0  # calls in flight through the pool (health checks leave those alone)
        self.spare = spare  # a warm spare until acquired; spares do not count against max_size
        self.owner: str | None = None  # the client that leased it (the service's per-client view)
        # The sandbox's CPU seconds when its last call started and ended (None: no call yet).
        self.cpu_at_start: float | None = None
        self.cpu_at_end = 0.0

    def info(self) -> SandboxInfo:
        return SandboxInfo(id=self.id, state=self.state, generation=self.generation,
                           created_at=self.created_at, last_used=self.last_used, execs=self.execs,
                           replacements=self.replacements, last_reason=self.last_reason,
                           limits=self.box.limits, isolated=self.box.isolated, pid=self.box.agent_pid,
                           owner=self.owner, template=_template_name(self.box), **self.box.usage())


class Pool:
    def __init__(self, config: PoolConfig | None = None) -> None:
        self.cfg = config or PoolConfig()
        self.events = EventLog(self.cfg.events_path)
        self._slots: dict[str, Slot] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._starter = ThreadPoolExecutor(max_workers=4, thread_name_prefix="sandbox-start")
        cgroup.sweep_stale()  # what a crashed service left
        reap_orphans()
        for sid, state in self.events.last_states().items():  # history from before a restart
            if state != "dead":
                self.events.record(sid, -1, "dead", "service restarted (sandboxes die with their service)")
        self.events.record("-", 0, "pool", f"pool started: {self.cfg.model_dump(exclude={'limits'})}")
        self._fill()
        self._health = threading.Thread(target=self._health_loop, name="sandbox-health", daemon=True)
        self._health.start()

    # -- leases ----------------------------------------------------------------------------------
    def acquire(self, limits: Limits | None = None, refill: bool = True,
                mounts: tuple[Mount, ...] = (), owner: str | None = None, template: str | None = None) -> SandboxInfo:
        """A ready sandbox: a warm spare when the limits are the pool's, else a cold start.

        `refill=False` leaves starting the next spare to the caller (`refill()`): the service
        does it after the response is sent, so a client never waits on a start it did not ask
        for (a fork, bwrap and Python start-up compete for the same cores). `mounts` (host code
        a hosted environment needs, read-only) always means a cold start, and replacements of
        this sandbox get them too. `owner`: the client it is leased to (SandboxInfo.owner).
        `template`: a template's name: its root file system (a warm spare of it if one is ready)."""
        info = None if mounts else self.acquire_spare(limits, owner, template)
        if info is not None:
            if refill:
                self.refill()
            return info
        slot = self._new_slot(limits or self.cfg.limits, "busy", "acquired (cold start)", mounts, owner, template)
        if refill:
            self.refill()
        return slot.info()

    def acquire_spare(self, limits: Limits | None = None, owner: str | None = None,
                      template: str | None = None) -> SandboxInfo | None:
        """A warm spare if one is ready for these limits and template, else None; never waits on a start."""
        if limits is not None and limits != self.cfg.limits:
            return None
        with self._lock:
            spare = next((s for s in self._slots.values() if s.state == "ready" and s.box.alive
                          and _template_name(s.box) == template), None)
            if spare is None:
                return None
            if self._leases() >= self.cfg.max_size:
                raise PoolFull(self._full_msg())
            spare.spare, spare.owner = False, owner
            self._set(spare, "busy", "acquired (warm spare)")
        return spare.info()

    def refill(self) -> None:
        """Start spares in the background until `warm` are ready again (nothing once closing)."""
        if self._stop.is_set():
            return
        try:
            self._starter.submit(self._fill)
        except RuntimeError:  # shut down by a close() that began after the check above
            pass

    def lease_to(self, sandbox_id: str, owner: str | None) -> None:
        """Hand a leased sandbox to the client `owner` (one filled for a run before the run asked)."""
        slot = self._get(sandbox_id)
        with self._lock:
            slot.owner = owner

    def release(self, sandbox_id: str, reason: str = "released by client") -> None:
        slot = self._get(sandbox_id)
        with self._lock:
            self._slots.pop(sandbox_id, None)
        self._set(slot, "stopping", reason)
        slot.box.stop()
        self._set(slot, "dead", reason)
        self.refill()

    def get(self, sandbox_id: str, owner: str | None = None) -> SandboxInfo:
        """`owner`: only that client's sandbox (another's is unknown to it); None: any."""
        slot = self._get(sandbox_id)
        if owner is not None and slot.owner != owner:
            raise UnknownSandbox(f"no sandbox {sandbox_id!r} (released, reaped, or never created)")
        return slot.info()

    def box(self, sandbox_id: str) -> LocalSandbox:
        """The sandbox process behind an id now (workspace.seed/snapshot/fork work on it)."""
        return self._get(sandbox_id).box

    def list(self, owner: str | None = None) -> list[SandboxInfo]:
        with self._lock:
            return [s.info() for s in self._slots.values() if owner is None or s.owner == owner]

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATES, 0)
        with self._lock:
            for s in self._slots.values():
                out[s.state] += 1
        return out

    # -- calls -----------------------------------------------------------------------------------
    def exec(self, sandbox_id: str, request: ExecRequest) -> ExecResult:
        return self._through(sandbox_id, lambda box: box.exec(request))

    def write_file(self, sandbox_id: str, path: str, data: bytes, mode: int | None = None) -> str:
        return self._through(sandbox_id, lambda box: box.write_file(path, data, mode))

    def read_file(self, sandbox_id: str, path: str) -> bytes:
        return self._through(sandbox_id, lambda box: box.read_file(path))

    def _through(self, sandbox_id: str, call):
        slot = self._get(sandbox_id)
        if slot.state in ("starting", "unhealthy") and not slot.spare:
            raise SandboxDied(f"sandbox {sandbox_id} is being replaced ({slot.last_reason}); retry shortly")
        if slot.state != "busy":
            raise SandboxError(f"sandbox {sandbox_id} is {slot.state}; acquire a sandbox first")
        box, generation = slot.box, slot.generation
        with self._lock:
            slot.in_call += 1
            slot.last_used = time.time()
        slot.cpu_at_start = self._cpu_s(box)
        try:
            out = call(box)
            slot.execs += 1
            return out
        except SandboxDied as e:
            self._replace(slot, generation, f"died during a call: {e}")
            raise SandboxDied(f"sandbox {sandbox_id} died during the call and was replaced by a fresh "
                              f"one (generation {slot.generation}; its files and session are gone)") from e
        finally:
            if slot.box is box:
                slot.cpu_at_end = self._cpu_s(box) or 0.0
            with self._lock:
                slot.in_call -= 1
                slot.last_used = time.time()

    # -- health ----------------------------------------------------------------------------------
    def check(self) -> None:
        """One health round (the health thread runs this every health_period_s)."""
        now = time.time()
        with self._lock:
            slots = list(self._slots.values())
        for slot in slots:
            if slot.state not in ("ready", "busy"):
                continue
            box, generation = slot.box, slot.generation
            if not box.alive:
                code = box.proc.returncode if box.proc is not None else None
                self._replace(slot, generation, f"dead: process exited (code {code})")
                continue
            if slot.in_call:
                continue  # a call in flight has its own deadline
            if slot.state == "busy" and now - slot.last_used > self.cfg.idle_timeout_s:
                self.release(slot.id, f"idle reaped: no call for {now - slot.last_used:.0f} s")
                continue
            cpu_before = self._cpu_s(box)
            problem = self._over_cpu_budget(slot, cpu_before) or self._probe(box)
            if cpu_before is not None and slot.cpu_at_start is not None:  # the probe's CPU is not the call's
                probe_cpu = (self._cpu_s(box) or cpu_before) - cpu_before
                slot.cpu_at_start += probe_cpu
                slot.cpu_at_end += probe_cpu
            if problem and slot.in_call == 0 and slot.generation == generation:
                with self._lock:
                    if slot.state in ("ready", "busy"):
                        slot.state = "unhealthy"  # an acquire no longer takes it
                self._set(slot, "unhealthy", problem)
                self._replace(slot, generation, problem)

    @staticmethod
    def _cpu_s(box: LocalSandbox) -> float | None:
        """The sandbox's CPU seconds so far: its cgroup's, else its process tree's (/proc)."""
        cg = box.cgroup
        if cg is not None:
            used = cg.cpu_s()
            if used is not None:
                return used
        proc = box.proc
        return cgroup.tree_cpu_s(proc.pid) if proc is not None else None

    def _over_cpu_budget(self, slot: Slot, now_s: float | None) -> str | None:
        """Why the sandbox must go when its last call's processes still run past that call's
        CPU budget (cpu_s, the whole sandbox from the call's start); else None."""
        if now_s is None or slot.cpu_at_start is None:
            return None
        used, since_end = now_s - slot.cpu_at_start, now_s - slot.cpu_at_end
        budget = slot.box.limits.cpu_s + CPU_SLACK_S
        if used > budget and since_end > BACKGROUND_CPU_S:
            return (f"cpu: background processes used {since_end:.1f} CPU-s after the call ended, "
                    f"{used:.1f} CPU-s since it began (cpu_s={slot.box.limits.cpu_s:g})")
        return None

    def _probe(self, box: LocalSandbox) -> str | None:
        """None if healthy, else why not (hung: no answer in time; failing: wrong answer)."""
        t0 = time.monotonic()
        try:
            r = box.exec(ExecRequest(code=PROBE_CODE, timeout_s=self.cfg.probe_timeout_s), grace_s=0.5)
        except SandboxDied as e:
            if "agent exited" in str(e):
                return "dead: process exited during the probe"
            return f"hung: no answer to the probe within {self.cfg.probe_timeout_s + 0.5:g} s"
        except SandboxError as e:
            return f"failing: probe error {e}"
        took = time.monotonic() - t0
        if r.limit == "wall":
            return f"hung: probe hit its {self.cfg.probe_timeout_s:g} s wall clock"
        if r.stdout.strip() != "42" or r.exit_code != 0:
            return f"failing: probe answered exit {r.exit_code}, stdout {r.stdout[:40]!r}, stderr {r.stderr[-80:]!r}"
        if took > self.cfg.probe_timeout_s:
            return f"slow: probe took {took:.2f} s (limit {self.cfg.probe_timeout_s:g} s)"
        return None

    def _health_loop(self) -> None:
        while not self._stop.wait(self.cfg.health_period_s):
            try:
                self.check()
                self._fill()
            except Exception as e:  # the health thread must outlive any one bad round
                self.events.record("-", 0, "pool", f"health round failed: {type(e).__name__}: {e}")

    # -- internals -------------------------------------------------------------------------------
    def _replace(self, slot: Slot, generation: int, reason: str) -> None:
        with self._lock:
            if slot.generation != generation or self._slots.get(slot.id) is not slot:
                return  # someone already replaced (or released) it
            slot.generation += 1
            slot.replacements += 1
            old, spare = slot.box, slot.spare
            if spare:  # dropped in the same step, so no acquire can take it on the way out
                self._slots.pop(slot.id, None)
            slot.state = "dead"
        self._set(slot, "dead", reason, generation=generation)
        old.stop()
        if spare:  # the filler starts another spare
            self.refill()
            return
        self._set(slot, "starting", f"replacement for generation {generation}: {reason}")
        box = self._start_box(slot.id, old.limits, old.mounts, old.template)
        if box is None:
            with self._lock:
                self._slots.pop(slot.id, None)
            self._set(slot, "dead", "replacement failed to start")
            return
        with self._lock:
            released = self._slots.get(slot.id) is not slot  # released (or the pool closed) meanwhile
            if not released:
                slot.box, slot.cpu_at_start, slot.cpu_at_end = box, None, 0.0
        if released:  # nothing would ever stop it
            box.stop()
            return
        self._set(slot, "busy", f"replaced (cause: {reason})")

    def _fill(self) -> None:
        """Start spares until `warm` are ready (and min_size are alive), within max_size."""
        while not self._stop.is_set():
            with self._lock:
                wanted, template = self._spare_wanted()
                if not wanted:
                    return
                placeholder = Slot(self._box(self.cfg.limits, template=template), "starting", spare=True)
                self._slots[placeholder.id] = placeholder
            self.events.record(placeholder.id, 0, "starting", "warm spare")
            try:
                placeholder.box.start(background=True)
            except SandboxError as e:
                with self._lock:
                    self._slots.pop(placeholder.id, None)
                self.events.record(placeholder.id, 0, "dead", f"failed to start: {e}")
                return
            if self._stop.is_set():
                placeholder.box.stop()
                return
            self._set(placeholder, "ready", f"started in {placeholder.box.start_s * 1e3:.0f} ms")

    def _spare_wanted(self) -> tuple[bool, str | None]:
        """Whether a spare should start (within max_size), and on which template (None: the host's root)."""
        alive = len(self._slots)
        if alive >= self.cfg.max_size + self.cfg.warm + sum(self.cfg.templates.values()):
            return False, None
        for template, warm in [(None, self.cfg.warm), *self.cfg.templates.items()]:
            ready = sum(s.state in ("ready", "starting") and s.box.limits == self.cfg.limits
                        and _template_name(s.box) == template for s in self._slots.values() if s.state != "busy")
            if warm > ready or (template is None and self.cfg.min_size > alive):
                return True, template
        return False, None

    def _box(self, limits: Limits, mounts: tuple[Mount, ...] = (), sandbox_id: str | None = None,
             template: str | Template | None = None) -> LocalSandbox:
        return LocalSandbox(limits, self.cfg.python, self.cfg.allow_unisolated, sandbox_id=sandbox_id,
                            python_packages=self.cfg.python_packages, mounts=mounts, dev_tools=self.cfg.dev_tools,
                            template=template)

    def _new_slot(self, limits: Limits, state: str, reason: str, mounts: tuple[Mount, ...] = (),
                  owner: str | None = None, template: str | None = None) -> Slot:
        with self._lock:
            if self._leases() >= self.cfg.max_size:
                raise PoolFull(self._full_msg())
            slot = Slot(self._box(limits, mounts, template=template), "starting", spare=False)
            slot.owner = owner
            self._slots[slot.id] = slot
        self.events.record(slot.id, 0, "starting", reason)
        try:
            slot.box.start()
        except SandboxError:
            with self._lock:
                self._slots.pop(slot.id, None)
            self.events.record(slot.id, 0, "dead", "failed to start")
            raise
        self._set(slot, state, f"{reason}, started in {slot.box.start_s * 1e3:.0f} ms")
        return slot

    def _leases(self) -> int:
        return sum(not s.spare for s in self._slots.values())

    def _full_msg(self) -> str:
        return f"pool full: max_size={self.cfg.max_size} sandboxes leased; release one or raise max_size"

    def _start_box(self, sandbox_id: str, limits: Limits, mounts: tuple[Mount, ...],
                   template: Template | None = None) -> LocalSandbox | None:
        try:
            return self._box(limits, mounts, sandbox_id, template).start()
        except SandboxError:
            return None

    def _set(self, slot: Slot, state: str, reason: str, generation: int | None = None) -> None:
        slot.state, slot.last_reason = state, reason
        self.events.record(slot.id, slot.generation if generation is None else generation, state, reason)

    def _get(self, sandbox_id: str) -> Slot:
        with self._lock:
            slot = self._slots.get(sandbox_id)
        if slot is None:
            raise UnknownSandbox(f"no sandbox {sandbox_id!r} (released, reaped, or never created)")
        return slot

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._starter.shutdown(wait=True, cancel_futures=True)
        self._health.join(timeout=self.cfg.probe_timeout_s + 10)
        with self._lock:
            slots = list(self._slots.values())
            self._slots.clear()
        for slot in slots:
            self._set(slot, "stopping", "pool closing")
            slot.box.stop()
            self._set(slot, "dead", "pool closing")
        self.events.record("-", 0, "pool", "pool closed")
        self.events.close()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _template_name(box: LocalSandbox) -> str | None:
    return box.template.name if box.template is not None else None
