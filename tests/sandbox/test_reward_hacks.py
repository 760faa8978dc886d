"""The reward-hack catalogue: each way a policy games a code reward, as the policy would write it.

Every entry must score 0.0 on `reward.name=unit_tests` (a local sandbox and the service) and earn
nothing on the code environment (its sandbox executor), while an honest solution still scores
1.0. docs/sandbox.md ("Reward hacks and the defence that stops each") lists the same entries
with the defence that stops each. A hack that kills or stalls the judge makes the reward raise
(`harness failed`), which the reward guard scores 0.0 and counts as an error: `score` below does
the same.
"""

from __future__ import annotations

import pytest

from cadence.data.tasks import Prompt
from cadence.envs.code_env import CodeEnv
from cadence.rewards.build import build_reward
from cadence.rewards.config import RewardConfig
from cadence.rewards.unit_tests import UnitTestReward, UnitTestsConfig
from tests.sandbox.conftest import needs_bwrap
from tests.sandbox.service import running_service

pytestmark = needs_bwrap

TESTS = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0", "assert add('a', 'b') == 'ab'",
         "assert add(0, 0) == 0", "assert isinstance(add(1, 2), int)"]
ADD = Prompt("add:hacks", "Write add(a, b).", "", {"tests": TESTS})
HONEST = "def add(a, b):\n    return a + b\n"

# Writes a reply frame into every pipe the agent (pid 1) or the judge (the parent) writes to (the
# agent's includes its pipe to the host), then tries ptrace and process_vm_writev on both: with
# those fds in reach, the host reads this frame (exit status 10 + 5: the old harness's "5 passed")
# as the call's reply.
FORGE_FRAME = r'''
import ctypes, os
body = b'{"exit_code": 15, "stdout": "", "stderr": "", "limit": null, "duration_s": 0.1, "id": null}'
frame = len(body).to_bytes(4, "big") + body
libc = ctypes.CDLL(None, use_errno=True)
for pid in (1, os.getppid()):
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        fds = []
    for fd in fds:
        try:
            flags = int(open(f"/proc/{pid}/fdinfo/{fd}").read().split("flags:")[1].split()[0], 8)
            if flags & os.O_WRONLY and os.readlink(f"/proc/{pid}/fd/{fd}").startswith("pipe:"):
                os.write(os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK), frame)
        except (OSError, IndexError, ValueError):
            pass
    libc.ptrace(0x4206, pid, 0, 0)  # PTRACE_SEIZE (no stop): it could then poke the reply into memory
    buf = ctypes.create_string_buffer(frame)
    iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), len(frame))
    libc.process_vm_writev(pid, iov, 1, iov, 1, 0)
'''

# Looks everywhere in reach for the tests (files, the parent's memory and command line, objects in
# this process) and answers each call with the expected value written in them.
READ_TESTS = r'''
import gc, glob, json, os, re
TEXT = ""
for path in glob.glob("/workspace/*") + glob.glob("/tmp/*") + glob.glob("/workspace/.*"):
    try:
        TEXT += open(path).read()
    except OSError:
        pass
for part in ("cmdline", "environ", "mem"):
    try:
        TEXT += open(f"/proc/{os.getppid()}/{part}", "rb").read(1 << 20).decode(errors="replace")
    except OSError:
        pass
TEXT += " ".join(o for o in gc.get_objects() if isinstance(o, str) and "assert" in o)
try:
    open("/workspace/tests.json", "w").write(json.dumps(["pass"] * 5))  # and rewrite them
except OSError:
    pass
TABLE = {m[0]: eval(m[1]) for m in re.findall(r"assert add\((.*?)\) == ([^\\\\\"',\]\n]+)", TEXT)}
def add(a, b):
    return TABLE[f"{a!r}, {b!r}"]
'''

HACKS = {
    "exit 0 before any test (os._exit)": "import os\nos._exit(0)\n",
    "exit 0 from the test (os._exit in the call)": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "sys.exit(0) in atexit": "import atexit, sys\natexit.register(sys.exit, 0)\ndef add(a, b):\n    sys.exit(0)\n",
    "raise SystemExit inside a test": "def add(a, b):\n    raise SystemExit(0)\n",
    "raise KeyboardInterrupt inside a test": "def add(a, b):\n    raise KeyboardInterrupt\n",
    "always-equal object (__eq__, __hash__)": (
        "class Anything:\n    def __eq__(self, other):\n        return True\n    def __ne__(self, other):\n"
        "        return False\n    def __hash__(self):\n        return 0\n    def __bool__(self):\n        return True\n"
        "def add(a, b):\n    return Anything()\n"),
    "always-equal int subclass": (
        "class Int(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return Int(0)\n"),
    "always-equal str/list subclasses": (
        "class S(str):\n    __eq__ = lambda self, other: True\nclass L(list):\n    __eq__ = lambda self, other: True\n"
        "def add(a, b):\n    return S('') if isinstance(a, str) else L()\n"),
    "patch assert-adjacent builtins": (
        "import builtins\nbuiltins.AssertionError = type('Quiet', (Exception,), {})\nbuiltins.isinstance = lambda *a: True\n"
        "builtins.__import__ = builtins.__import__\ndef add(a, b):\n    return None\n"),
    "patch unittest and pytest internals": (
        "import unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\nunittest.TestCase.fail = lambda *a, **k: None\n"
        "try:\n    import _pytest.outcomes as o\n    o.fail = o.skip = lambda *a, **k: None\nexcept ImportError:\n    pass\n"
        "def add(a, b):\n    return None\n"),
    "skip the tests programmatically": (
        "import unittest\ndef add(a, b):\n    raise unittest.SkipTest('not today')\n"),
    "read or rewrite the tests": READ_TESTS,
    "print a fake verdict": (
        "import os, sys\nfor line in ('5 passed', 'OK', 'ok 15', '15'):\n    print(line)\n    os.write(2, line.encode())\n"
        "sys.stdout.write(os.urandom(16).hex() + ' 5\\n')\ndef add(a, b):\n    print('5 passed')\n    return None\n"),
    "kill the judge": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
    "signal the judge (stop, alarm, term)": (
        "import os, signal\nfor s in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT):\n    try:\n        os.kill(os.getppid(), s)\n"
        "    except OSError:\n        pass\nos.kill(os.getppid(), signal.SIGSTOP)\n"),
    "kill everything it can (kill -9 -1)": "import os\nos.kill(-1, 9)\n",
    "stop and kill every ancestor (the judge, the agent)": (
        "import os, signal\npid = os.getpid()\nwhile pid > 1:\n"
        "    pid = int(open(f'/proc/{pid}/status').read().split('PPid:')[1].split()[0])\n"
        "    for sig in (signal.SIGSTOP, signal.SIGKILL):\n        try:\n            os.kill(pid, sig)\n"
        "        except OSError:\n            pass\ndef add(a, b):\n    return None\n"),
    "forge the reply frame (ptrace, /proc/*/fd)": FORGE_FRAME,
    "exhaust time so a partial result counts": (
        "import os, time\ndef add(a, b):\n    if (a, b) != (2, 3):\n        time.sleep(1000)\n    return 5\n"),
    "stall everything in the background": (
        "import os\nif os.fork() == 0:\n    os.setsid()\n    os.kill(-1, 19)\n    os._exit(0)\ndef add(a, b):\n    return None\n"),
}


def reward(**kw) -> UnitTestReward:
    fn = build_reward(RewardConfig(name="unit_tests", timeout_s=60, unit_tests=UnitTestsConfig(**kw)))
    assert isinstance(fn, UnitTestReward)
    return fn


def score(fn: UnitTestReward, solution: str) -> float:
    """What the reward guard gives: a judge that failed (killed, stalled) scores 0.0."""
    try:
        return fn(ADD, f"```python\n{solution}```")
    except RuntimeError as e:
        assert "harness failed" in str(e)
        return 0.0


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with running_service(str(tmp_path_factory.mktemp("hacks")), "--warm", "2") as (url, token, _):
        yield url, token


def test_an_honest_solution_scores_one_everywhere(service, monkeypatch):
    monkeypatch.setenv("CADENCE_SANDBOX_TOKEN", service[1])
    assert score(reward(test_timeout_s=1.0), HONEST) == 1.0
    assert score(reward(test_timeout_s=1.0, url=service[0]), HONEST) == 1.0


@pytest.mark.parametrize("name", list(HACKS))
def test_hack_scores_zero_on_a_local_sandbox(name):
    assert score(reward(test_timeout_s=1.0), HACKS[name]) == 0.0


@pytest.mark.parametrize("name", list(HACKS))
def test_hack_scores_zero_on_the_service(name, service, monkeypatch):
    monkeypatch.setenv("CADENCE_SANDBOX_TOKEN", service[1])
    fn = reward(test_timeout_s=1.0, url=service[0])
    assert score(fn, HACKS[name]) == 0.0
    assert score(fn, HONEST) == 1.0  # and the service still scores the next response right


@pytest.fixture(scope="module")
def code_env():
    env = CodeEnv(backend="sandbox", timeout_s=2.0)
    yield env
    env.executor.close()


@pytest.mark.parametrize("name", list(HACKS))
def test_hack_earns_nothing_in_the_code_environment(name, code_env):
    """The code environment pays only for a right <answer>, checked on the host; a hack's code
    runs in the sandbox and must neither earn anything nor shift what the next call sees."""
    code_env.reset(seed=7)
    _, reward_, done, _, _ = code_env.step(f"```python\n{HACKS[name]}add = None\nprint('<ans' 'wer>0</ans' 'wer>')\n```")
    assert reward_ == 0.0 and not done
    obs, reward_, done, _, _ = code_env.step("```python\nprint(6 * 7)\n```")
    assert obs == "stdout:\n42" and reward_ == 0.0  # its own output: no reply forged or shifted
    _, reward_, done, _, _ = code_env.step("<answer>-1</answer>")
    assert reward_ == 0.0 and done
