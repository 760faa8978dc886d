"""Hosted environments: an environment class runs inside a sandbox, `reset`/`step`/`close` over
the API (ROCK does this for GEM environments), so a crashing or misbehaving environment is
isolated and replaced like any sandbox.

The environment is one self-contained Python file (its `source`) defining a class with the
cadence environment contract (cadence.envs.contract: `reset(seed) -> (obs, info)`,
`step(action) -> (obs, reward, terminated, truncated, info)`, optional `close()`). The service
writes it into a sandbox and keeps the instance in the sandbox's Python session. If the
environment crashes, hangs past `step_timeout_s` or its sandbox dies, the call answers 503
(`EnvCrashed`) and the next `reset` starts it again from its source.

    env = HostedEnv(url, token, source=open("my_env.py").read(), class_name="MyEnv")
    obs, info = env.reset(0); obs, reward, done, truncated, info = env.step("...")
    env.close()
"""

from __future__ import annotations

import json
import threading
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

from cadence.sandbox.client import Sandbox
from cadence.sandbox.models import ExecRequest, Limits, SandboxDied, SandboxError
from cadence.sandbox.pool import Pool

MODULE = "cadence_hosted_env"
RESULT = "/tmp/.cadence_env_result.json"


class EnvSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str = Field(description="Python source of one self-contained module")
    class_name: str
    kwargs: dict[str, Any] = Field(default_factory=dict)
    step_timeout_s: float = Field(30.0, gt=0)
    limits: Limits | None = None


class ResetRequest(BaseModel):
    seed: int = 0


class StepRequest(BaseModel):
    action: str


class EnvError(SandboxError):
    """The environment raised (its traceback's last line), or could not be made."""


class EnvCrashed(SandboxDied):
    """The environment's process died or hung; it is re-made from its source on the next reset."""


class EnvHost:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.specs: dict[str, EnvSpec] = {}
        self.needs_make: set[str] = set()
        self._lock = threading.Lock()

    def make(self, spec: EnvSpec) -> str:
        if not spec.class_name.isidentifier():
            raise EnvError(f"class_name: {spec.class_name!r} is not a Python identifier")
        sid = self.pool.acquire(spec.limits).id
        with self._lock:
            self.specs[sid] = spec
        try:
            self._make(sid)
        except SandboxError:
            self.close(sid)
            raise
        return sid

    def _make(self, sid: str) -> None:
        spec = self._spec(sid)
        self.pool.write_file(sid, f"{MODULE}.py", spec.source.encode())
        code = (f"import json, sys\nsys.path.insert(0, '/workspace')\nimport {MODULE}\n"
                f"_env = {MODULE}.{spec.class_name}(**json.loads({json.dumps(spec.kwargs)!r}))")
        r = self.pool.exec(sid, ExecRequest(code=code, session=True, timeout_s=spec.step_timeout_s))
        if not r.ok:
            raise EnvError(f"making {spec.class_name} failed: {_last_line(r.stderr) or r.limit or r.exit_code}")
        self.needs_make.discard(sid)

    def _call(self, sid: str, expr: str) -> Any:
        spec = self._spec(sid)
        if sid in self.needs_make:
            self._make(sid)
        code = (f"import json\n_r = {expr}\n"
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
        obs, info = self._call(sid, f"_env.reset({int(seed)})")
        return {"observation": obs, "info": info}

    def step(self, sid: str, action: str) -> dict:
        obs, reward, terminated, truncated, info = self._call(sid, f"_env.step({action!r})")
        return {"observation": obs, "reward": reward, "terminated": terminated, "truncated": truncated,
                "info": info}

    def close(self, sid: str) -> None:
        try:
            if sid not in self.needs_make:
                self._call(sid, "_env.close() if hasattr(_env, 'close') else None")
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
    @app.post("/v1/envs")
    def make(spec: EnvSpec) -> dict:
        return {"id": host.make(spec)}

    @app.post("/v1/envs/{env_id}/reset")
    def reset(env_id: str, req: ResetRequest) -> dict:
        return host.reset(env_id, req.seed)

    @app.post("/v1/envs/{env_id}/step")
    def step(env_id: str, req: StepRequest) -> dict:
        return host.step(env_id, req.action)

    @app.delete("/v1/envs/{env_id}")
    def close(env_id: str) -> dict:
        host.close(env_id)
        return {"ok": True}


class HostedEnv(Sandbox):
    """A text environment that runs on a sandbox service (it satisfies the environment contract,
    so the agentic pipeline's runner can drive it like a local one)."""

    def __init__(self, url: str | list[str] | None = None, token: str | None = None, *, source: str,
                 class_name: str, kwargs: dict | None = None, step_timeout_s: float = 30.0,
                 limits: Limits | None = None) -> None:
        super().__init__(url, token, limits)
        self.spec = EnvSpec(source=source, class_name=class_name, kwargs=kwargs or {},
                            step_timeout_s=step_timeout_s, limits=limits)

    def start(self) -> HostedEnv:
        body = self.spec.model_dump()
        for u in self._pick():
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
