"""A solution that raises an exception with control-flow meaning (StopIteration ends a `map`
silently, StopAsyncIteration an `async for`) must fail the tests that call it, not end their
loops with nothing checked: the judge hands the test a plain failure instead (issue 33, #4).
Scored on a local sandbox and on the service, as the reward-hack catalogue is."""

from __future__ import annotations

import pytest

from cadence.data.tasks import Prompt
from cadence.rewards.build import build_reward
from cadence.rewards.config import RewardConfig
from cadence.rewards.unit_tests import UnitTestReward, UnitTestsConfig
from tests.sandbox.conftest import needs_bwrap
from tests.sandbox.service import running_service

pytestmark = needs_bwrap

ASYNC_FOR = """
class Pairs:
    def __init__(self):
        self.n = 0
    def __aiter__(self):
        return self
    async def __anext__(self):
        self.n += 1
        if self.n > 3:
            raise StopAsyncIteration
        return add(self.n, 1)
async def check():
    async for total in Pairs():
        assert total > 1
try:
    check().send(None)
except StopIteration:
    pass
"""
TESTS = [
    "assert all(map(lambda x: add(x, 1) == x + 1, range(5)))",
    "assert not list(filter(lambda x: add(x, 0) != x, range(5)))",
    "import itertools\nassert all(itertools.starmap(lambda a, b: add(a, b) == a + b, [(1, 2), (3, 4)]))",
    ASYNC_FOR,
]
ADD = Prompt("add:control-flow", "Write add(a, b).", "", {"tests": TESTS})
HONEST = "def add(a, b):\n    return a + b\n"
FORGED = {
    "StopIteration": "def add(a, b):\n    raise StopIteration\n",
    "StopAsyncIteration": "def add(a, b):\n    raise StopAsyncIteration\n",
    "StopIteration by a subclass": "class Done(StopIteration):\n    pass\ndef add(a, b):\n    raise Done()\n",
}


def reward(**kw) -> UnitTestReward:
    fn = build_reward(RewardConfig(name="unit_tests", timeout_s=60, unit_tests=UnitTestsConfig(test_timeout_s=2.0, **kw)))
    assert isinstance(fn, UnitTestReward)
    return fn


def scores(fn: UnitTestReward) -> dict[str, float]:
    return {name: fn(ADD, f"```python\n{code}```") for name, code in {"honest": HONEST, **FORGED}.items()}


EXPECTED = {"honest": 1.0, **dict.fromkeys(FORGED, 0.0)}


def test_control_flow_exceptions_fail_on_a_local_sandbox():
    assert scores(reward()) == EXPECTED


def test_control_flow_exceptions_fail_on_the_service(tmp_path, monkeypatch):
    with running_service(str(tmp_path), "--warm", "1") as (url, token, _):
        monkeypatch.setenv("CADENCE_SANDBOX_TOKEN", token)
        assert scores(reward(url=url)) == EXPECTED


@pytest.mark.parametrize("name", ["ValueError", "KeyError", "ZeroDivisionError"])
def test_ordinary_errors_still_reach_the_test_as_themselves(name):
    """A test that expects the solution to raise still sees the error it expects."""
    prompt = Prompt("raises", "", "", {"tests": [f"try:\n    check(-1)\nexcept {name}:\n    pass\nelse:\n    assert False"]})
    solution = f"def check(x):\n    raise {name}('negative')\n"
    assert reward()(prompt, f"```python\n{solution}```") == 1.0
