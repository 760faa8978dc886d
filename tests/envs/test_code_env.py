"""The code-execution environment and its guarded subprocess executor."""

from __future__ import annotations

import re

import pytest

from cadence.envs.code_env import TASKS, CodeEnv, check_answer, make_task, show_output
from cadence.envs.executor import ExecResult, SubprocessExecutor

FENCE = "```"


def py(code: str) -> str:
    return f"Let me compute it.\n{FENCE}python\n{code}\n{FENCE}\n"


def test_executor_returns_stdout_stderr_and_exit_code(tmp_path):
    result = SubprocessExecutor().run("import sys\nprint(6 * 7)\nprint('warn', file=sys.stderr)", 10)
    assert (result.stdout, result.stderr, result.exit_code, result.timed_out) == ("42\n", "warn\n", 0, False)
    failed = SubprocessExecutor().run("x = 1\n1 / 0", 10)
    assert failed.exit_code == 1 and failed.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert 'File "main.py", line 2' in failed.stderr and "<string>" not in failed.stderr


def test_executor_runs_in_an_empty_folder_with_a_bare_environment():
    result = SubprocessExecutor().run(
        "import os, sys\nprint(sorted(os.listdir('.')))\nprint('CADENCE_SECRET' in os.environ)\n"
        "print(sys.flags.isolated)",
        10,
    )
    import os

    os.environ["CADENCE_SECRET"] = "1"
    try:
        again = SubprocessExecutor().run("import os\nprint('CADENCE_SECRET' in os.environ)", 10)
    finally:
        del os.environ["CADENCE_SECRET"]
    assert result.stdout.splitlines() == ["['err', 'main.py', 'out']", "False", "1"]
    assert again.stdout == "False\n"


def test_executor_stops_hangs_memory_hogs_and_floods():
    hang = SubprocessExecutor().run("while True:\n    pass", 0.5)
    assert hang.timed_out and hang.exit_code is None
    hog = SubprocessExecutor(memory_mb=256).run("x = bytearray(1 << 30)\nprint('allocated')", 10)
    assert "MemoryError" in hog.stderr and "allocated" not in hog.stdout
    flood = SubprocessExecutor(output_bytes=10_000).run("while True:\n    print('y' * 100)", 10)
    assert len(flood.stdout) <= 10_000 and "File too large" in flood.stderr


def test_task_answers_match_an_independent_computation():
    kinds = set()
    for seed in range(40):
        question, answer = make_task(seed)
        numbers = [int(n) for n in re.findall(r"\d+", question)]
        kind = next((k for k in ("digits", "prime", "exactly", "remainder") if k in question), None)
        kinds.add(kind)
        if kind == "digits":
            base, exp = numbers
            assert answer == sum(int(d) for d in str(base**exp))
        elif kind == "prime":
            lo, hi = numbers
            is_prime = lambda n: n > 1 and all(n % k for k in range(2, int(n**0.5) + 1))  # noqa: E731
            assert answer == sum(map(is_prime, range(lo, hi + 1)))
        elif kind == "exactly":
            _, n, a, b = numbers
            assert answer == sum((x % a == 0) != (x % b == 0) for x in range(1, n + 1))
        elif kind == "remainder":
            base, exp, m = numbers
            result = 1
            for bit in bin(exp)[2:]:  # square-and-multiply, not pow()
                result = result * result % m
                if bit == "1":
                    result = result * base % m
            assert answer == result
    assert kinds == {"digits", "prime", "exactly", "remainder", None}  # None: fibonacci, below
    assert make_task(3) == make_task(3) and len({make_task(s) for s in range(40)}) == 40
    assert make_task(5, ("fibonacci",))[0].startswith("With F(0)=0")


def test_fibonacci_task_against_the_closed_definition():
    for seed in range(5):
        question, answer = make_task(seed, ("fibonacci",))
        n = int(question.split("what is F(")[1].split(")")[0])
        m = int(question.rstrip("?").split()[-1])
        fib = [0, 1]
        while len(fib) <= n:
            fib.append(fib[-1] + fib[-2])
        assert answer == fib[n] % m


def test_check_answer():
    assert check_answer(" 1,234 ", 1234) and check_answer("1 234", 1234)
    assert not check_answer("1234.5", 1234) and not check_answer("about 1234", 1234)


def test_an_episode_runs_code_then_answers():
    env = CodeEnv(tasks=["digit_sum"], timeout_s=30)
    question, _ = env.reset(11)
    base, exp = re.findall(r"\d+", question.splitlines()[0])
    obs, reward, terminated, _, info = env.step(py(f"print(sum(map(int, str({base}**{exp}))))"))
    assert (reward, terminated, info["exit_code"]) == (0.0, False, 0)
    computed = int(obs.split("stdout:\n")[1].split()[0])
    obs, reward, terminated, _, info = env.step(f"So the answer is <answer>{computed}</answer>")
    assert (obs, reward, terminated, info["correct"]) == ("Correct.", 1.0, True, True)
    env.reset(11)
    assert env.step(f"<answer>{computed + 1}</answer>")[1:3] == (0.0, True)


def test_code_in_a_code_tag_and_replies_without_code_or_answer():
    env = CodeEnv(timeout_s=30)
    env.reset(0)
    assert env.step("<code>print('tagged')</code>")[0] == "stdout:\ntagged"
    obs, reward, terminated, _, info = env.step("I think it is big.")
    assert info["no_action"] and (reward, terminated) == (0.0, False) and "<answer>" in obs
    assert "no output" in env.step(py("x = 1"))[0]


class RecordingExecutor:
    """Stands in for the sandbox backend: any object with run(code, timeout_s)."""

    def __init__(self) -> None:
        self.calls = []

    def run(self, code: str, timeout_s: float) -> ExecResult:
        self.calls.append((code, timeout_s))
        return ExecResult("from the sandbox\n", "", 0)


def test_the_executor_is_swappable():
    executor = RecordingExecutor()
    env = CodeEnv(executor=executor, timeout_s=2.5)
    env.reset(0)
    assert env.step(py("print(1)\nprint(2)"))[0] == "stdout:\nfrom the sandbox"
    assert executor.calls == [("print(1)\nprint(2)\n", 2.5)]
    with pytest.raises(ValueError, match="unknown backend 'docker'"):
        CodeEnv(backend="docker")
    with pytest.raises(ValueError, match="unknown tasks"):
        CodeEnv(tasks=["chess"])
    assert set(TASKS) >= {"digit_sum", "primes", "fibonacci"}


def test_long_output_is_truncated_keeping_the_start_of_stdout_and_the_end_of_stderr():
    text = show_output(ExecResult("a" * 50 + "END", "START" + "b" * 50, 1), limit=20)
    out, err = text.split("stderr:\n")
    assert out.startswith("stdout:\n" + "a" * 20) and "END" not in out and "(truncated)" in out
    assert err.endswith("b" * 20) and "START" not in err
    assert show_output(ExecResult("", "", None, timed_out=True), 20).startswith("(timed out")
