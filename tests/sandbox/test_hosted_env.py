"""Hosted environments over the real service: reset/step/close, and a crashing, hanging or
snooping environment is contained and re-made."""

from __future__ import annotations

import pytest

from cadence.envs.contract import TextEnv
from cadence.sandbox import SandboxDied, SandboxError
from cadence.sandbox.hosted_env import HostedEnv
from cadence.sandbox.testing import running_service
from tests.sandbox.conftest import needs_bwrap

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
