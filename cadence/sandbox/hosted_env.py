"""Hosted environments: an environment class runs inside a sandbox, `reset`/`step`/`close` over
the API (ROCK does this for GEM environments), so a crashing or misbehaving environment is
isolated and replaced like any sandbox.

The environment is any class with the cadence environment contract (cadence.envs.contract:
`reset(seed) -> (obs, info)`, `step(action) -> (obs, reward, terminated, truncated, info)`,
optional `close()`, sync or async), named like `env.name` (a built-in such as "frozenlake", or
"python:pkg.module:Class" / "python:/path/file.py:Class") or given as one self-contained module's
`source`. A name is resolved on the service's host, and only what it needs is shown to the
sandbox, read-only under /opt/code: the one top-level package (for built-ins, the installed
`cadence` package, not the checkout around it) or the one file; the interpreter's packages come
with the sandbox's Python (python_packages="site"). The service keeps the instance in the
sandbox's Python session. If the environment crashes, hangs past `step_timeout_s` or its sandbox
dies, the call answers 503 (`EnvCrashed`) and the next `reset` makes it again.

    env = HostedEnv(url, token, name="frozenlake", kwargs={"size": 4})
    obs, info = env.reset(0); obs, reward, done, truncated, info = env.step("<answer>R</answer>")
    env.close()

In a training config: env.name=python:cadence.sandbox.hosted_env:HostedEnv with env.kwargs.name,
env.kwargs.url (the token from $CADENCE_SANDBOX_TOKEN or its file) and the hosted environment's
own arguments, either under env.kwargs.kwargs or directly in env.kwargs: any keyword HostedEnv
does not take itself passes through to the hosted class (so a config written for the local
environment, e.g. examples/frozenlake.yaml's env.kwargs.rules, runs hosted unchanged).
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator

from cadence.builtin_envs import BUILTIN_ENVS
from cadence.sandbox.auth import AdminOnly, owner_filter
from cadence.sandbox.client import Sandbox
from cadence.sandbox.isolation import CODE_ROOT, Mount
from cadence.sandbox.models import MAX_SECONDS, ExecRequest, Limits, SandboxDied, SandboxError
from cadence.sandbox.pool import Pool

MODULE = "cadence_hosted_env"
RESULT = "/tmp/.cadence_env_result.json"
PYTHON_PREFIX = "python:"
# Defined once in the environment's Python session: async environments run on one event loop.
RUN_HELPER = """
def _run(result):
    if not hasattr(result, "__await__"):
        return result
    global _loop
    if "_loop" not in globals():
        import asyncio
        _loop = asyncio.new_event_loop()
    return _loop.run_until_complete(result)
"""


class EnvSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str | None = Field(None, description="Python source of one self-contained module (with class_name)")
    class_name: str | None = Field(None, description="the class in `source`")
    name: str | None = Field(
        None, description="an environment name as in env.name, resolved on the service's host: a "
        "built-in (frozenlake, sokoban, ...) or python:pkg.module:Class / python:/path/file.py:Class; "
        "only that package (or file) is shown to the sandbox, read-only")
    kwargs: dict[str, Any] = Field(default_factory=dict)
    step_timeout_s: float = Field(30.0, gt=0, le=MAX_SECONDS, allow_inf_nan=False)
    limits: Limits | None = None
    template: str | None = Field(None, max_length=64, description="a template's name on the service: the sandbox's root file system")

    @model_validator(mode="after")
    def _one_kind(self) -> EnvSpec:
        if (self.source is None) == (self.name is None):
            raise ValueError("give either source (with class_name) or name")
        if self.source is not None and self.class_name is None:
            raise ValueError("source needs class_name")
        return self


class ResetRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seed: int = Field(0, ge=-(2**63), le=2**63 - 1)


class StepRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: str


class EnvError(SandboxError):
    """The environment raised (its traceback's last line), or could not be made."""


class EnvCrashed(SandboxDied):
    """The environment's process died or hung; it is re-made from its source on the next reset."""


def _identifiers(dotted: str) -> bool:
    return all(part.isidentifier() for part in dotted.split("."))


def _package_mount(module: str, where: str) -> Mount:
    """The top-level package (or single-file module) `module` lives in, as a read-only mount
    under CODE_ROOT: found on the host without importing anything of it."""
    top = module.split(".")[0]
    spec = importlib.util.find_spec(top)
    if spec is None:
        raise EnvError(f"{where}: no module {top!r} on the service's host")
    if spec.submodule_search_locations:
        # A regular package only: a namespace "package" is any plain folder on sys.path (the
        # service's working directory's subfolders too), and mounting it would show all of it.
        if spec.origin is None or os.path.basename(spec.origin) != "__init__.py":
            raise EnvError(f"{where}: {top!r} is a plain folder (no __init__.py), not a Python package; "
                           "only packages and single .py files are hosted")
        return Mount(os.path.dirname(spec.origin), f"{CODE_ROOT}/{top}")
    if spec.origin is None or not spec.origin.endswith(".py"):
        raise EnvError(f"{where}: {top!r} is not a Python source module or package")
    return Mount(spec.origin, f"{CODE_ROOT}/{top}.py")


def resolve_env(name: str) -> tuple[str | None, str, Mount]:
    """An env name as (module or None for a file, class, the mount the sandbox needs)."""
    if name in BUILTIN_ENVS:
        module, _, cls = BUILTIN_ENVS[name][0].partition(":")
        return module, cls, _package_mount(module, f"environment {name!r}")
    if not name.startswith(PYTHON_PREFIX):
        raise EnvError(f"environment {name!r}: not a built-in ({', '.join(BUILTIN_ENVS)}) "
                       "nor python:module:Class / python:/path/file.py:Class")
    target, _, cls = name[len(PYTHON_PREFIX):].rpartition(":")
    if not target or not cls.isidentifier():
        raise EnvError(f"environment {name!r}: expected python:module:Class or python:/path/file.py:Class")
    if target.endswith(".py") or "/" in target:
        path = os.path.realpath(target)
        if not path.endswith(".py") or not os.path.isfile(path):
            raise EnvError(f"environment {name!r}: no Python file {path} on the service's host")
        return None, cls, Mount(path, f"{CODE_ROOT}/user/{os.path.basename(path)}")
    if not _identifiers(target):
        raise EnvError(f"environment {name!r}: {target!r} is not a module path")
    return target, cls, _package_mount(target, f"environment {name!r}")


class EnvHost:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.specs: dict[str, EnvSpec] = {}
        self.needs_make: set[str] = set()
        self._lock = threading.Lock()

    def make(self, spec: EnvSpec, owner: str | None = None) -> str:
        """A new environment in a sandbox leased to `owner` (the client); returns its id."""
        if spec.class_name is not None and not spec.class_name.isidentifier():
            raise EnvError(f"class_name: {spec.class_name!r} is not a Python identifier")
        mounts = (resolve_env(spec.name)[2],) if spec.name is not None else ()
        sid = self.pool.acquire(spec.limits, mounts=mounts, owner=owner, template=spec.template).id
        with self._lock:
            self.specs[sid] = spec
        try:
            self._make(sid)
        except SandboxError:
            self.close(sid)
            raise
        return sid

    def _import_code(self, sid: str, spec: EnvSpec) -> tuple[str, str]:
        """Code that binds `_mod` to the environment's module in the sandbox, and the class name."""
        if spec.source is not None:
            self.pool.write_file(sid, f"{MODULE}.py", spec.source.encode())
            return f"sys.path.insert(0, '/workspace')\nimport {MODULE} as _mod", spec.class_name
        module, cls, mount = resolve_env(spec.name)
        # Unisolated (the rlimits-only fallback) there are no mounts: the host's own paths.
        path = mount.inside if self.pool.get(sid).isolated else mount.host
        if module is None:
            return ("import importlib.util\n"
                    f"_spec = importlib.util.spec_from_file_location({MODULE!r}, {path!r})\n"
                    "_mod = importlib.util.module_from_spec(_spec)\n"
                    f"sys.modules[{MODULE!r}] = _mod\n_spec.loader.exec_module(_mod)"), cls
        return (f"sys.path.insert(0, {os.path.dirname(path)!r})\n"
                f"import importlib\n_mod = importlib.import_module({module!r})"), cls

    def _make(self, sid: str) -> None:
        spec = self._spec(sid)
        what = spec.class_name or spec.name
        imports, cls = self._import_code(sid, spec)
        code = (f"import json, sys\n{RUN_HELPER}\n{imports}\n"
                f"_env = _mod.{cls}(**json.loads({json.dumps(spec.kwargs)!r}))")
        r = self.pool.exec(sid, ExecRequest(code=code, session=True, timeout_s=spec.step_timeout_s))
        if not r.ok:
            raise EnvError(f"making {what} failed: {_last_line(r.stderr) or r.limit or r.exit_code}")
        self.needs_make.discard(sid)

    def _call(self, sid: str, statement: str) -> Any:
        """Run `statement` (which sets `_r`) in the environment's session; `_r` as JSON."""
        spec = self._spec(sid)
        if sid in self.needs_make:
            self._make(sid)
        code = (f"import json\n{statement}\n"
                f"open({RESULT!r}, 'w').write(json.dumps(_r, default=repr))")
        try:
            r = self.pool.exec(sid, ExecRequest(code=code, session=True, timeout_s=spec.step_timeout_s))
        except SandboxDied as e:
            self.needs_make.add(sid)
            raise EnvCrashed(f"environment sandbox died ({e}); the next reset re-makes it") from e
        if r.session_started or r.session_lost or r.limit is not None:
            self.needs_make.add(sid)
            why = f"hit its {r.limit} limit" if r.limit else "its process had died"
            raise EnvCrashed(f"environment {why} during the call; the next reset re-makes it")
        if r.exit_code != 0:
            raise EnvError(f"environment raised: {_last_line(r.stderr)}")
        return json.loads(self.pool.read_file(sid, RESULT))

    def reset(self, sid: str, seed: int) -> dict:
        if sid in self.needs_make:
            self._make(sid)
        obs, info = self._call(sid, f"_o, _i = _run(_env.reset({int(seed)}))\n_r = [_o, _i]")
        return {"observation": obs, "info": info}

    def step(self, sid: str, action: str) -> dict:
        # numpy scalars (np.bool_, np.float32) are not JSON: plain floats and bools cross.
        obs, reward, terminated, truncated, info = self._call(
            sid, f"_o, _w, _te, _tr, _i = _run(_env.step({action!r}))\n_r = [_o, float(_w), bool(_te), bool(_tr), _i]")
        return {"observation": obs, "reward": reward, "terminated": terminated, "truncated": truncated,
                "info": info}

    def close(self, sid: str) -> None:
        try:
            if sid not in self.needs_make:
                self._call(sid, "_r = _run(_env.close()) if hasattr(_env, 'close') else None")
        except SandboxError:
            pass  # closing a broken environment: its sandbox goes anyway
        finally:
            with self._lock:
                self.specs.pop(sid, None)
            self.needs_make.discard(sid)
            self.pool.release(sid, "environment closed")

    def _spec(self, sid: str) -> EnvSpec:
        with self._lock:
            spec = self.specs.get(sid)
        if spec is None:
            raise SandboxError(f"no environment {sid!r} (closed, or never made)")
        return spec


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def add_env_routes(app: FastAPI, host: EnvHost) -> None:
    """The /v1/envs routes; an environment is its sandbox's client's, like the sandbox."""

    def mine(request: Request, env_id: str) -> str:
        host.pool.get(env_id, owner_filter(request))  # another client's: 404
        return env_id

    @app.post("/v1/envs")
    def make(request: Request, spec: EnvSpec) -> dict:
        if spec.name and spec.name.startswith(PYTHON_PREFIX) and owner_filter(request) is not None:
            # It shows the sandbox a file or package of the service's host, read with its rights.
            raise AdminOnly("a python: environment name mounts host code: admin token only; "
                            "a client sends the module's source (source, class_name) or names a built-in")
        return {"id": host.make(spec, request.state.client)}

    @app.post("/v1/envs/{env_id}/reset")
    def reset(request: Request, env_id: str, req: ResetRequest) -> dict:
        return host.reset(mine(request, env_id), req.seed)

    @app.post("/v1/envs/{env_id}/step")
    def step(request: Request, env_id: str, req: StepRequest) -> dict:
        return host.step(mine(request, env_id), req.action)

    @app.delete("/v1/envs/{env_id}")
    def close(request: Request, env_id: str) -> dict:
        host.close(mine(request, env_id))
        return {"ok": True}


class HostedEnv(Sandbox):
    """A text environment that runs on a sandbox service (it satisfies the environment contract,
    so the agentic pipeline's runner can drive it like a local one)."""

    def __init__(self, url: str | list[str] | None = None, token: str | None = None, *,
                 name: str | None = None, source: str | None = None, class_name: str | None = None,
                 kwargs: dict | None = None, step_timeout_s: float = 30.0,
                 limits: Limits | dict | None = None, connect_wait_s: float = 0.0, template: str | None = None,
                 **env_kwargs: Any) -> None:
        """`name`: an env name as in env.name ("frozenlake", "python:pkg.mod:Class",
        "python:/path/file.py:Class"), resolved on the service's host; or `source` and
        `class_name`: one self-contained module's text. The hosted class gets `env_kwargs` (any
        other keyword) and `kwargs`, which wins where both name the same argument. `template`: a
        template's name on the service, the sandbox's root file system."""
        limits = Limits(**limits) if isinstance(limits, dict) else limits
        super().__init__(url, token, limits, connect_wait_s=connect_wait_s)
        if name and name.startswith(PYTHON_PREFIX):  # a relative file is the caller's, not the service's cwd's
            target, _, cls = name[len(PYTHON_PREFIX):].rpartition(":")
            if (target.endswith(".py") or "/" in target) and os.path.isfile(target):
                name = f"{PYTHON_PREFIX}{os.path.abspath(target)}:{cls}"
        try:
            self.spec = EnvSpec(source=source, class_name=class_name, name=name, kwargs={**env_kwargs, **(kwargs or {})},
                                step_timeout_s=step_timeout_s, limits=limits, template=template)
        except ValueError as e:
            raise SandboxError(f"HostedEnv: {e.errors()[0]['msg']}") from None

    def start(self) -> HostedEnv:
        body = self.spec.model_dump()
        for u in self._run(self._pick()):
            self.id = self._req("POST", f"{u}/v1/envs", json=body).json()["id"]
            self.url = u
            return self
        raise SandboxError("no sandbox service")

    def _env_url(self) -> str:
        if self.id is None:
            self.start()
        return f"{self.url}/v1/envs/{self.id}"

    def reset(self, seed: int) -> tuple[str, dict]:
        out = self._req("POST", f"{self._env_url()}/reset", json={"seed": seed}).json()
        return out["observation"], out["info"]

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        out = self._req("POST", f"{self._env_url()}/step", json={"action": action}).json()
        return out["observation"], out["reward"], out["terminated"], out["truncated"], out["info"]

    def stop(self) -> None:
        if self.id is not None:
            try:
                self._req("DELETE", f"{self.url}/v1/envs/{self.id}")
            except SandboxError as e:
                if "404" not in str(e) and "no environment" not in str(e):
                    raise
            self.id = None
