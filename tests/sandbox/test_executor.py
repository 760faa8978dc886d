"""The code environment on the sandbox backend: model code runs isolated, results map over."""

from __future__ import annotations

import os

import httpx
import pytest

from cadence.envs.code_env import CodeEnv
from cadence.envs.sandbox_executor import SandboxExecutor
from cadence.sandbox.client import Sandbox
from tests.sandbox.conftest import needs_bwrap
from tests.sandbox.service import running_service

pytestmark = needs_bwrap


def test_executor_runs_isolated_and_maps_results():
    ex = SandboxExecutor(memory_mb=256)
    try:
        r = ex.run("print(sum(range(10)))", 5.0)
        assert (r.stdout, r.exit_code, r.timed_out) == ("45\n", 0, False)
        r = ex.run("while True: pass", 0.5)
        assert r.timed_out and r.exit_code is None
        r = ex.run("1 / 0", 5.0)
        assert r.exit_code == 1 and "ZeroDivisionError" in r.stderr
        r = ex.run(f"print(open({os.path.abspath(__file__)!r}).read()[:10])", 5.0)
        assert r.exit_code == 1 and "FileNotFoundError" in r.stderr
        # A dead sandbox is replaced and the snippet run again.
        os.kill(ex._box.agent_host_pid(), 9)
        assert ex.run("print('again')", 5.0).stdout == "again\n"
    finally:
        ex.close()
    assert ex._box is None


def test_code_env_on_the_sandbox_backend():
    env = CodeEnv(backend="sandbox", timeout_s=5.0)  # by name: no import of cadence.sandbox needed
    assert isinstance(env.executor, SandboxExecutor)
    try:
        env.reset(seed=3)
        obs, reward, terminated, _, info = env.step("```python\nprint(2 ** 10)\n```")
        assert "1024" in obs and reward == 0.0 and not terminated and info["exit_code"] == 0
        obs, *_ = env.step("```python\nimport socket; socket.create_connection(('1.1.1.1', 53), timeout=1)\n```")
        assert "unreachable" in obs.lower() or "OSError" in obs
    finally:
        env.executor.close()


def test_executor_on_the_service(tmp_path, monkeypatch):
    with running_service(str(tmp_path), "--warm", "0") as (url, token, _):
        ex = SandboxExecutor(url=url, token=token)
        try:
            assert ex.run("print(6 * 7)", 5.0).stdout == "42\n"
            assert isinstance(ex._box, Sandbox)
        finally:
            ex.close()
        # From a config: env.kwargs.backend=sandbox env.kwargs.sandbox_url=URL (token from the environment)
        monkeypatch.setenv("CADENCE_SANDBOX_TOKEN", token)
        env = CodeEnv(backend="sandbox", sandbox_url=url)
        try:
            env.reset(seed=1)
            obs, *_ = env.step("```python\nimport os; print(os.getuid(), os.getcwd())\n```")
            assert "65534 /workspace" in obs
            leased = httpx.get(f"{url}/v1/status", headers={"Authorization": f"Bearer {token}"}).json()["counts"]["busy"]
            assert leased == 1  # the code ran on the service
        finally:
            env.executor.close()
    with pytest.raises(ValueError, match="sandbox_url and template need backend='sandbox'"):
        CodeEnv(sandbox_url="http://127.0.0.1:1")
