"""reward.name=unit_tests: the model's code against a task's tests, in a real bubblewrap sandbox
(locally and on the service), scored through the reward guard like any reward."""

from __future__ import annotations

import uuid

import pytest

from cadence.data.tasks import Prompt
from cadence.rewards.build import build_reward
from cadence.rewards.config import RewardConfig
from cadence.rewards.guard import RewardGuard
from cadence.rewards.unit_tests import UnitTestReward, UnitTestsConfig, extract_code
from tests.sandbox.conftest import needs_bwrap
from tests.sandbox.service import running_service

pytestmark = needs_bwrap

ADD = Prompt("add:1", "Write add(a, b).", "", {"tests": ["assert add(2, 3) == 5", "assert add(-1, 1) == 0",
                                                          "assert add('a', 'b') == 'ab'", "assert add(0, 0) == 0"]})
RIGHT = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```"
HALF = "```python\ndef add(a, b):\n    return abs(a) + abs(b)\n```"  # fails the negative and the str tests


def reward(**kw) -> UnitTestReward:
    fn = build_reward(RewardConfig(name="unit_tests", timeout_s=30, unit_tests=UnitTestsConfig(**kw)))
    assert isinstance(fn, UnitTestReward)
    return fn


def test_scores_the_share_of_tests_passed_or_all():
    fraction, all_pass = reward(), reward(scoring="all")
    assert fraction(ADD, RIGHT) == 1.0 and all_pass(ADD, RIGHT) == 1.0
    assert fraction(ADD, HALF) == 0.5 and all_pass(ADD, HALF) == 0.0
    assert fraction(ADD, "def add(a, b): return a + b") == 1.0  # no fence: the whole response
    assert fraction(ADD, "```python\nthis is not python\n```") == 0.0


def test_extract_code_takes_the_last_block():
    assert extract_code("```python\nx = 1\n```\nthen\n```py\nx = 2\n```") == "x = 2\n"
    assert extract_code("```\nbare\n```") == "bare\n"


def test_misbehaving_solutions_are_contained(tmp_path):
    secret = uuid.uuid4().hex
    planted = tmp_path / "secret.txt"
    planted.write_text(secret)
    fn = reward(test_timeout_s=1.0)
    tests = Prompt("t:1", "", "", {"tests": ["assert add(1, 1) == 2", f"assert open({str(planted)!r}).read() == {secret!r}"]})
    # Prints a fake verdict and reads a host file: the print goes nowhere, the file is not there.
    liar = (f"def add(a, b): return a + b\nprint('passed 2/2')\n"
            f"try:\n    print(open({str(planted)!r}).read())\nexcept OSError:\n    pass")
    assert fn(tests, liar) == 0.5
    # A test that never ends is stopped at test_timeout_s, and a test out of time scores the whole
    # solution 0 (a judge's "time limit exceeded": time spent never buys a partial result).
    looping = Prompt("t:2", "", "", {"tests": ["assert add(1, 1) == 2", "while True: pass", "assert add(2, 2) == 4"]})
    assert fn(looping, RIGHT) == 0.0
    slow = "import time\ndef add(a, b):\n    if a == 2:\n        time.sleep(60)\n    return a + b\n"
    assert fn(Prompt("t:3", "", "", {"tests": ["assert add(1, 1) == 2", "assert add(2, 2) == 4"]}), slow) == 0.0
    # A solution that writes outside its sandbox leaves nothing on the host.
    target = tmp_path / "pwned"
    fn(ADD, f"open({str(target)!r}, 'w').write('x')\ndef add(a, b): return a + b")
    assert not target.exists()
    # Killing its parent (the zygote, the user's own) and every ancestor it can name (the judge,
    # the agent) neither spoils nor forges the run: the judge runs at another uid and counts.
    killer = ("import os, signal\npid = os.getpid()\nwhile pid > 1:\n"
              "    pid = int(open(f'/proc/{pid}/status').read().split('PPid:')[1].split()[0])\n"
              "    for sig in (signal.SIGSTOP, signal.SIGKILL):\n        try:\n            os.kill(pid, sig)\n"
              "        except OSError:\n            pass\n")
    assert fn(ADD, killer + "def add(a, b): return a + b") == 1.0
    assert fn(ADD, killer + "def add(a, b): return None") == 0.0


def test_through_the_guard_failures_score_zero_and_are_counted():
    cfg = RewardConfig(name="unit_tests", timeout_s=30, unit_tests=UnitTestsConfig(test_timeout_s=1.0))
    guard = RewardGuard(build_reward(cfg), cfg.timeout_s, 1)  # a forked worker starts the sandboxes
    try:
        no_tests = Prompt("bad:1", "", "", {"test": ["assert True"]})
        killer = "import os\nos.kill(os.getppid(), 9)"  # its zygote: the test fails, nothing else
        out = guard.score([(ADD, RIGHT), (ADD, HALF), (no_tests, RIGHT), (ADD, killer)])
        assert [o.reward for o in out] == [1.0, 0.5, 0.0, 0.0]
        assert "field 'tests' must be a non-empty list" in out[2].error and out[3].error is None
        assert guard.stats()["errors"] == 1
    finally:
        guard.close()


def test_config_errors_are_clear(monkeypatch):
    with pytest.raises(ValueError, match="reward.timeout_s .* must exceed reward.unit_tests.test_timeout_s"):
        RewardConfig(name="unit_tests", timeout_s=2, unit_tests=UnitTestsConfig(test_timeout_s=3))
    with pytest.raises(ValueError, match="extra"):
        UnitTestsConfig(test_field="tests")
    with pytest.raises(ValueError, match="no sandbox service answers"):
        reward(url="http://127.0.0.1:9")
    import cadence.rewards.unit_tests as ut

    monkeypatch.setattr(ut.shutil, "which", lambda name: None)
    with pytest.raises(ValueError, match="install bubblewrap"):
        reward()


def test_on_the_service(tmp_path, monkeypatch):
    with running_service(str(tmp_path), "--warm", "1") as (url, token, _):
        monkeypatch.setenv("CADENCE_SANDBOX_TOKEN", token)
        fn = reward(url=url)
        assert fn(ADD, RIGHT) == 1.0 and fn(ADD, HALF) == 0.5
        assert fn(ADD, "import os\nos.kill(os.getppid(), 9)") == 0.0  # its zygote; the judge counts
        monkeypatch.setenv("CADENCE_SANDBOX_TOKEN", "wrong")
        with pytest.raises(ValueError, match="401"):
            reward(url=url)


def test_solutions_may_import_the_interpreters_packages():
    """The sandbox runs the host interpreter with its site-packages (read-only): numpy works."""
    prompt = Prompt("np:1", "Write mean(xs).", "", {"tests": ["assert mean([1, 2, 3]) == 2.0", "assert mean([4]) == 4.0"]})
    solution = "```python\nimport numpy as np\n\ndef mean(xs):\n    return float(np.mean(xs))\n```"
    assert reward(test_timeout_s=10.0)(prompt, solution) == 1.0
    assert reward(test_timeout_s=10.0, python_packages="none")(prompt, solution) == 0.0  # stdlib only


def test_the_judge_runs_the_usual_shapes_of_test():
    """Tests run in the judge against the solution in its own process: objects, generators,
    expected exceptions (by their nearest built-in class), helpers and imports of the test's own,
    constants and nested plain data work; comparing an object of the solution does not."""
    solution = (
        "import math\nLIMIT = 10\nclass DomainError(ValueError):\n    pass\n"
        "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n        self.items.append(x)\n"
        "    def pop(self):\n        return self.items.pop()\n    def __len__(self):\n        return len(self.items)\n"
        "def count_up(n):\n    yield from range(n)\n"
        "def sqrt(x):\n    if x < 0:\n        raise DomainError(x)\n    return math.sqrt(x)\n"
        "def double(x):\n    return 2 * x\ndef pair():\n    return (1, 'a')\ndef table():\n    return {'a': [1, 2.5, None]}\n")
    tests = ["s = Stack(); s.push(1); s.push(2); assert s.pop() == 2 and len(s) == 1",
             "assert list(count_up(3)) == [0, 1, 2]",
             "try:\n    sqrt(-1)\nexcept ValueError:\n    pass\nelse:\n    raise AssertionError('no error')",
             "def quad(x):\n    return double(double(x))\nassert quad(3) == 12",
             "import math\nassert abs(sqrt(2) - math.sqrt(2)) < 1e-9",
             "assert LIMIT == 10 and pair() == (1, 'a') and table() == {'a': [1, 2.5, None]}",
             "assert Stack() == Stack()"]  # objects of the solution are not compared: fails
    fn = reward(test_timeout_s=5.0)
    assert fn(Prompt("shapes:1", "", "", {"tests": tests}), solution) == 6 / 7
