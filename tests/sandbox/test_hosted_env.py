"""Hosted environments over the real service: reset/step/close, and a crashing, hanging or
snooping environment is contained and re-made."""

from __future__ import annotations

import os

import pytest

from cadence.envs.contract import TextEnv
from cadence.observe.metrics import read_jsonl
from cadence.sandbox import SandboxDied, SandboxError
from cadence.sandbox.hosted_env import HostedEnv
from tests.sandbox.conftest import needs_bwrap
from tests.sandbox.service import running_service

pytestmark = needs_bwrap

SOURCE = '''
import os, time

class Counter:
    """Guess the target: step("n") says higher/lower; crash/hang/snoop misbehave on purpose."""
    def __init__(self, span=10):
        self.span, self.closed = span, False

    def reset(self, seed):
        self.target, self.turns = seed % self.span, 0
        return f"guess 0..{self.span - 1}", {"pid_ns_pid": os.getpid()}

    def step(self, action):
        self.turns += 1
        if action == "crash":
            os._exit(3)
        if action == "hang":
            time.sleep(60)
        if action == "snoop":
            return open("/etc/shadow").read(), 0.0, True, False, {}
        if action == "raise":
            raise ValueError("bad action")
        guess = int(action)
        if guess == self.target:
            return "right", 1.0, True, False, {"turns": self.turns}
        return ("higher" if guess < self.target else "lower"), 0.0, False, False, {"turns": self.turns}
'''


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with running_service(str(tmp_path_factory.mktemp("envsvc")), "--warm", "1") as svc:
        yield svc


def make(service, **kw) -> HostedEnv:
    url, token, _ = service
    return HostedEnv(url, token, source=SOURCE, class_name="Counter", kwargs={"span": 10}, **kw).start()


def test_reset_step_close(service):
    env = make(service)
    assert isinstance(env, TextEnv)
    try:
        obs, info = env.reset(7)
        assert obs == "guess 0..9" and info["pid_ns_pid"] > 1
        assert env.step("3")[:3] == ("higher", 0.0, False)
        obs, reward, terminated, truncated, info = env.step("7")
        assert (obs, reward, terminated, truncated, info) == ("right", 1.0, True, False, {"turns": 2})
    finally:
        env.close()


def test_misbehaving_environment_is_contained_and_remade(service):
    env = make(service, step_timeout_s=1.0)
    try:
        env.reset(4)
        with pytest.raises(SandboxDied, match="re-makes it"):
            env.step("crash")
        assert env.reset(5)[0] == "guess 0..9" and env.step("5")[1] == 1.0
        env.reset(2)
        with pytest.raises(SandboxDied, match="wall limit"):
            env.step("hang")
        env.reset(1)
        with pytest.raises(SandboxError, match="ValueError: bad action"):
            env.step("raise")
        assert env.step("1")[1] == 1.0  # an exception does not lose the environment's state
        with pytest.raises(SandboxError, match="FileNotFoundError"):
            env.step("snoop")
    finally:
        env.close()


def test_bad_specs_are_one_line_errors(service):
    url, token, _ = service
    with pytest.raises(SandboxError, match="making Nope failed: AttributeError"):
        HostedEnv(url, token, source=SOURCE, class_name="Nope").start()
    with pytest.raises(SandboxError, match="not a Python identifier"):
        HostedEnv(url, token, source=SOURCE, class_name="os.system").start()
    with pytest.raises(SandboxError, match="SyntaxError"):
        HostedEnv(url, token, source="def (", class_name="X").start()


def test_builtin_frozenlake_by_name_steps_like_the_local_one(service):
    """A registry environment (gymnasium inside): only the installed cadence package is mounted."""
    from cadence.envs.frozenlake import FrozenLakeEnv

    url, token, _ = service
    local = FrozenLakeEnv(size=4, slippery=True)
    env = HostedEnv(url, token, name="frozenlake", kwargs={"size": 4, "slippery": True}).start()
    try:
        for seed in (0, 7):
            assert env.reset(seed) == local.reset(seed)
            for action in ("Right", "Down", "Right", "Down", "Down", "Right"):
                got, want = env.step(action), local.step(action)
                assert got == want
                if got[2] or got[3]:
                    break
    finally:
        env.close()


NUMPY_ENV = '''
import os
import numpy as np

class Walk:
    """A numpy random walk: the target is drawn from the seed; the sibling file stays unseen."""
    def reset(self, seed):
        self.target = int(np.random.default_rng(seed).integers(0, 100))
        return "guess", {"numpy": np.__version__}

    def step(self, action):
        if action == "snoop":
            return open(os.path.join(os.path.dirname(__file__), "secret.txt")).read(), 0.0, True, False, {}
        try:  # a trained model writes anything: text that is not a number is a wrong guess, not a crash
            guess = int(action)
        except ValueError:
            return "not a number", 0.0, False, False, {}
        return ("right" if guess == self.target else "wrong"), np.float32(guess == self.target), \\
            np.bool_(guess == self.target), False, {}
'''


def test_user_python_file_env_importing_numpy_is_hosted_and_sees_only_its_file(service, tmp_path):
    import numpy as np

    url, token, _ = service
    path = tmp_path / "walk_env.py"  # under pytest's private tmp folder (mode 700): staged as root
    path.write_text(NUMPY_ENV)
    (tmp_path / "secret.txt").write_text("not for the sandbox")
    env = HostedEnv(url, token, name=f"python:{path}:Walk").start()
    try:
        obs, info = env.reset(3)
        assert info == {"numpy": np.__version__}
        target = int(np.random.default_rng(3).integers(0, 100))
        assert env.step(str(target + 1)) == ("wrong", 0.0, False, False, {})
        assert env.step(str(target)) == ("right", 1.0, True, False, {})  # numpy scalars cross as JSON
        with pytest.raises(SandboxError, match="FileNotFoundError"):
            env.step("snoop")
    finally:
        env.close()


def test_a_module_env_by_name_and_bad_names(service, tmp_path, monkeypatch):
    url, token, _ = service
    env = HostedEnv(url, token, name="python:cadence.envs.frozenlake:FrozenLakeEnv").start()
    try:
        assert isinstance(env.reset(0)[0], str)
    finally:
        env.close()
    with pytest.raises(SandboxError, match="'tests' is a plain folder"):  # a namespace folder: not mounted
        HostedEnv(url, token, name="python:tests.agentic_envs:Parity").start()
    (tmp_path / "rel_env.py").write_text("from tests.agentic_envs import Parity as P\n"
                                         "class R:\n    def reset(self, seed):\n        return 'rel', {}\n"
                                         "    def step(self, a):\n        return '', 0.0, True, False, {}\n")
    monkeypatch.chdir(tmp_path)  # a relative file is the caller's: the service runs elsewhere
    env = HostedEnv(url, token, name="python:rel_env.py:R")
    with pytest.raises(SandboxError, match="No module named 'tests'"):
        env.start()  # only the file is mounted, not what it imports from around it
    (tmp_path / "rel_env.py").write_text((tmp_path / "rel_env.py").read_text().split("\n", 1)[1])
    env = HostedEnv(url, token, name="python:rel_env.py:R").start()
    try:
        assert env.reset(0)[0] == "rel"
    finally:
        env.close()
    with pytest.raises(SandboxError, match="no module 'nope'"):
        HostedEnv(url, token, name="python:nope.mod:X").start()
    with pytest.raises(SandboxError, match="not a built-in"):
        HostedEnv(url, token, name="frozenlak").start()
    with pytest.raises(SandboxError, match="no Python file"):
        HostedEnv(url, token, name="python:/nonexistent/env.py:X").start()
    with pytest.raises(SandboxError, match="either source"):
        HostedEnv(url, token, name="frozenlake", source="x = 1", class_name="X")


@pytest.mark.slow
@pytest.mark.parametrize("env_name", ["frozenlake", "numpy_file"])
def test_agentic_training_steps_hosted_environments_through_the_service(service, env_name, tmp_path):
    """`cadence train` with env.name=python:cadence.sandbox.hosted_env:HostedEnv: every reset and
    step of the rollout goes over HTTP into a sandbox (the registry's frozenlake, and a user file
    that imports numpy)."""

    from cadence.config import load_config
    from cadence.recipes.train_rlvr import train
    from tests.quick_run import QUICK_RUN

    url, token, _ = service
    if env_name == "numpy_file":
        (tmp_path / "walk_env.py").write_text(NUMPY_ENV)
        hosted = [f"env.kwargs.name=python:{tmp_path / 'walk_env.py'}:Walk"]
    else:
        hosted = ["env.kwargs.name=frozenlake", "env.kwargs.kwargs.rules=false"]
    cfg = load_config(None, [
        *QUICK_RUN, "env.name=python:cadence.sandbox.hosted_env:HostedEnv", *hosted,
        f"env.kwargs.url={url}", f"env.kwargs.token={token}", "env.action_tag=null", "env.max_turns=2",
        "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=3",
        "trainer.steps=2", f"logging.run_dir={tmp_path}/run",
    ])
    made_before = _envs_made(url, token)
    summary = train(cfg)
    steps = read_jsonl(summary.run_dir / "metrics.jsonl")
    assert [r["step"] for r in steps if r["step"] > 0] == [1, 2]
    last = steps[-1]
    assert last["rollout/episodes_total"] >= 2 * 4 and last["rollout/turns_per_episode"] == 2
    lost = {k: v for k, v in last.items() if k.startswith("rollout/episodes_lost") or k == "rollout/episodes_retried_total"}
    assert lost and not any(lost.values()), lost
    assert _envs_made(url, token) > made_before  # the environments lived on the service


def _envs_made(url: str, token: str) -> int:
    """Sandboxes the service cold-started (each hosted environment takes one)."""
    import httpx

    events = httpx.get(f"{url}/v1/events", params={"limit": 10000},
                       headers={"Authorization": f"Bearer {token}"}).json()
    return sum(e["reason"].startswith("acquired (cold start)") for e in events)


def test_a_service_without_site_packages_cannot_host_a_numpy_env(tmp_path):
    """python_packages=none (the config option, from the service's command line): the standard
    library only, and the failure is a one-line error naming the missing module."""
    path = tmp_path / "walk_env.py"
    path.write_text(NUMPY_ENV)
    with running_service(str(tmp_path), "--warm", "0", "--python-packages", "none") as (url, token, _):
        with pytest.raises(SandboxError, match="making python:.* failed: ModuleNotFoundError: No module named 'numpy'"):
            HostedEnv(url, token, name=f"python:{path}:Walk").start()
        assert HostedEnv(url, token, source=SOURCE, class_name="Counter").start().reset(1)[0] == "guess 0..9"


def test_an_edited_env_file_is_what_the_next_env_runs(service, tmp_path):
    """A file is staged for the sandbox's uid by a bind mount, which pins the file's inode: an
    edit (here a new file renamed over it, as editors save) must reach the next environment."""
    url, token, _ = service
    path = tmp_path / "version_env.py"
    for version in (1, 2):
        new = tmp_path / "version_env.py.new"
        new.write_text(f"class V:\n    def reset(self, seed):\n        return 'v{version}', {{}}\n"
                       "    def step(self, action):\n        return '', 0.0, True, False, {}\n")
        os.replace(new, path)
        env = HostedEnv(url, token, name=f"python:{path}:V").start()
        try:
            assert env.reset(0)[0] == f"v{version}"
        finally:
            env.close()


def test_a_killed_registry_env_is_remade_with_its_package(service):
    """The replacement sandbox gets the same /opt/code mount, so the built-in imports again."""
    import signal
    import time

    import httpx

    url, token, _ = service
    env = HostedEnv(url, token, name="sokoban", step_timeout_s=20.0).start()
    try:
        first = env.reset(3)
        info = httpx.get(f"{url}/v1/sandboxes/{env.id}", headers={"Authorization": f"Bearer {token}"}).json()
        os.kill(info["pid"], signal.SIGKILL)
        with pytest.raises(SandboxDied, match="re-makes it"):
            for _ in range(50):  # until the service notices (the call, or its health check first)
                env.step("Up")
                time.sleep(0.1)
        assert env.reset(3) == first
    finally:
        env.close()


def test_hosted_code_env_runs_snippets_on_the_same_interpreter(service):
    """The code env starts `sys.executable` with a bare environment: inside a sandbox that is
    the relocated host interpreter, which must load its own libpython (not a system one of the
    same name) and see its packages."""
    import sys

    import numpy as np

    url, token, _ = service
    env = HostedEnv(url, token, name="code", kwargs={"timeout_s": 20.0}).start()
    try:
        env.reset(1)
        obs = env.step("```python\nimport sys, numpy\nprint(sys.version)\nprint(numpy.__version__)\n```")[0]
        assert obs == f"stdout:\n{sys.version}\n{np.__version__}", obs
    finally:
        env.close()


def test_a_plain_folder_is_never_mounted_as_a_hosted_env(tmp_path, monkeypatch):
    """Issue 26 finding 5: a name whose top level is a plain folder (a namespace package: any
    folder on sys.path) mounted all of that folder into the sandbox."""
    from cadence.sandbox.hosted_env import EnvError, resolve_env

    plain = tmp_path / "plainfolder"
    plain.mkdir()
    (plain / "env.py").write_text("class E:\n    pass\n")
    (plain / "private_notes.txt").write_text("not for the sandbox")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(EnvError, match="plain folder \\(no __init__.py\\), not a Python package"):
        resolve_env("python:plainfolder.env:E")
    (plain / "__init__.py").write_text("")  # a real package: that package is mounted
    module, cls, mount = resolve_env("python:plainfolder.env:E")
    assert (module, cls, mount.host) == ("plainfolder.env", "E", str(plain))
    single = tmp_path / "single_env.py"
    single.write_text("class S:\n    pass\n")
    assert resolve_env(f"python:{single}:S")[2].host == str(single)  # a single file: that file


def test_the_documented_hosted_frozenlake_config_runs(service, monkeypatch):
    """Issue 28 item 4: docs/sandbox.md's `cadence train --config examples/frozenlake.yaml
    env.name=python:cadence.sandbox.hosted_env:HostedEnv env.kwargs.name=frozenlake
    env.kwargs.kwargs.rules=false env.kwargs.url=...` failed: the YAML's env.kwargs (rules,
    neighbours) merged into HostedEnv's, which refused them. They pass through to the hosted class."""
    from cadence.config import load_config
    from cadence.envs.build import env_factory
    from cadence.envs.frozenlake import FrozenLakeEnv

    url, token, _ = service
    monkeypatch.setenv("CADENCE_SANDBOX_TOKEN", token)  # as the docs say: the token from the environment
    cfg = load_config("examples/frozenlake.yaml", [
        "env.name=python:cadence.sandbox.hosted_env:HostedEnv", "env.kwargs.name=frozenlake",
        "env.kwargs.kwargs.rules=false", f"env.kwargs.url={url}"])
    env = env_factory(cfg.env)()
    local = FrozenLakeEnv(rules=False, neighbours=True)
    try:
        assert env.spec.kwargs == {"rules": False, "neighbours": True}
        obs, _ = env.reset(3)
        assert obs == local.reset(3)[0] and "L:" in obs  # the neighbours line: the YAML's kwarg arrived
        assert env.step("R") == local.step("R")
    finally:
        env.close()


def test_another_clients_environment_is_not_there(service):
    import httpx

    url, admin, _ = service
    tokens = {n: httpx.post(f"{url}/v1/clients", json={"name": n}, headers={"Authorization": f"Bearer {admin}"}).json()["token"]
              for n in ("env-alice", "env-bob")}
    env = HostedEnv(url, tokens["env-alice"], source=SOURCE, class_name="Counter").start()
    try:
        env.reset(1)
        hb = {"Authorization": f"Bearer {tokens['env-bob']}"}
        for method, path, body in [("POST", "/reset", {"seed": 0}), ("POST", "/step", {"action": "1"}), ("DELETE", "", None)]:
            r = httpx.request(method, f"{url}/v1/envs/{env.id}{path}", json=body, headers=hb)
            assert r.status_code == 404, (path, r.text)
        assert env.step("1")[0] == "right"
        with pytest.raises(SandboxError, match="403 a python: environment name mounts host code: admin token only"):
            HostedEnv(url, tokens["env-bob"], name="python:cadence.envs.frozenlake:FrozenLakeEnv").start()
        bob_lake = HostedEnv(url, tokens["env-bob"], name="frozenlake").start()  # a built-in: fine
        bob_lake.close()
    finally:
        env.close()
