"""A code-execution tool environment: the model runs Python, reads the output, then answers.

Each episode is one computation task drawn from the seed (digit sums of big
powers, prime counts, Fibonacci numbers modulo m, ...): easy to compute with a
few lines of Python, hard to do in one's head. A turn is the whole response:

* with ``<answer>N</answer>``: checked, reward 1.0 if N is right, episode over;
* else with a ```` ```python ```` block (or ``<code>...</code>``): the last one
  runs in the executor, the observation is its stdout and stderr (truncated);
* else: the policy is told how to reply, reward 0.

`action_tag = None`: the runner passes the whole response, code and all.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from typing import Any

from cadence.data.tasks import stable_hash
from cadence.envs.contract import ResetReturn, StepReturn
from cadence.envs.executor import ExecResult, Executor, SubprocessExecutor

_CODE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```|<code>(.*?)</code>", re.DOTALL | re.I)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.I)


def _sandbox_executor(**kwargs: object) -> Executor:
    """bubblewrap-isolated execution (cadence/sandbox), imported only when asked for."""
    from cadence.envs.sandbox_executor import SandboxExecutor

    return SandboxExecutor(**kwargs)


EXECUTORS: dict[str, Callable[..., Executor]] = {"subprocess": SubprocessExecutor, "sandbox": _sandbox_executor}

HOW = (
    "You can run Python: put code in a ```python block and you will see what it prints. "
    "When you know the answer, reply with <answer>NUMBER</answer>."
)


def _primes_between(lo: int, hi: int) -> int:
    sieve = bytearray([1]) * (hi + 1)
    sieve[:2] = b"\x00\x00"
    for i in range(2, int(hi**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(range(i * i, hi + 1, i)))
    return sum(sieve[lo:])


def _fib_mod(n: int, m: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, (a + b) % m
    return a


def _task_digit_sum(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 9), rng.randint(50, 300)
    return f"What is the sum of the decimal digits of {a}**{b}?", sum(map(int, str(a**b)))


def _task_primes(rng: random.Random) -> tuple[str, int]:
    lo = rng.randint(1, 5000)
    hi = lo + rng.randint(500, 20000)
    return f"How many prime numbers are there between {lo} and {hi} inclusive?", _primes_between(lo, hi)


def _task_fibonacci(rng: random.Random) -> tuple[str, int]:
    n, m = rng.randint(100, 5000), rng.choice((97, 1009, 10007, 65537))
    question = f"With F(0)=0, F(1)=1, F(k)=F(k-1)+F(k-2), what is F({n}) modulo {m}?"
    return question, _fib_mod(n, m)


def _task_divisible(rng: random.Random) -> tuple[str, int]:
    n, a, b = rng.randint(1000, 10**6), rng.randint(3, 30), rng.randint(3, 30)
    both = n // math.lcm(a, b)
    answer = n // a + n // b - 2 * both  # inclusion-exclusion: multiples of one, not both
    return f"How many integers from 1 to {n} are divisible by exactly one of {a} and {b}?", answer


def _task_power_mod(rng: random.Random) -> tuple[str, int]:
    a, b, m = rng.randint(2, 10**6), rng.randint(10**3, 10**9), rng.randint(10**3, 10**6)
    return f"What is the remainder when {a}**{b} is divided by {m}?", pow(a, b, m)


TASKS: dict[str, Callable[[random.Random], tuple[str, int]]] = {
    "digit_sum": _task_digit_sum,
    "primes": _task_primes,
    "fibonacci": _task_fibonacci,
    "divisible": _task_divisible,
    "power_mod": _task_power_mod,
}


def make_task(seed: int, families: tuple[str, ...] = tuple(TASKS)) -> tuple[str, int]:
    """(question, integer answer) for `seed`; the family is drawn from `families` too."""
    rng = random.Random(stable_hash("code-task", seed))
    return TASKS[rng.choice(sorted(families))](rng)


def check_answer(text: str, answer: int) -> bool:
    """True when `text` (the inside of <answer>) is the integer `answer` (commas, spaces allowed)."""
    cleaned = text.strip().replace(",", "").replace("_", "").replace(" ", "")
    try:
        return int(cleaned) == answer
    except ValueError:
        return False


def show_output(result: ExecResult, limit: int) -> str:
    """The observation for one run: stdout, then stderr (its end: the error), each truncated."""
    parts = []
    if result.timed_out:
        parts.append("(timed out: the code was stopped)")
    out = result.stdout if len(result.stdout) <= limit else result.stdout[:limit] + "\n...(truncated)"
    err = result.stderr if len(result.stderr) <= limit else "...(truncated)\n" + result.stderr[-limit:]
    if out:
        parts.append(f"stdout:\n{out.rstrip()}")
    if err:
        parts.append(f"stderr:\n{err.rstrip()}")
    if not out and not err and not result.timed_out:
        parts.append("(no output: print what you want to see)")
    return "\n".join(parts)


class CodeEnv:
    """Compute-then-answer tasks with a Python tool (see the module docstring)."""

    action_tag = None

    def __init__(
        self,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        output_chars: int = 1000,
        backend: str = "subprocess",
        tasks: list[str] | None = None,
        executor: Executor | None = None,
        sandbox_url: str | None = None,
        template: str | None = None,
    ) -> None:
        families = tuple(tasks or TASKS)
        unknown = [name for name in families if name not in TASKS]
        if unknown:
            raise ValueError(f"code env: unknown tasks {unknown}; known: {list(TASKS)}")
        if executor is None:
            if backend not in EXECUTORS:
                raise ValueError(f"code env: unknown backend {backend!r}; known: {list(EXECUTORS)}")
            if (sandbox_url is not None or template is not None) and backend != "sandbox":
                raise ValueError("code env: sandbox_url and template need backend='sandbox'")
            service = {"url": sandbox_url} if sandbox_url is not None else {}  # else a local sandbox
            if template is not None:  # a template's root file system (cadence/sandbox/templates.py)
                service["template"] = template
            executor = EXECUTORS[backend](memory_mb=memory_mb, **service)
        self.executor = executor
        self.timeout_s, self.output_chars, self.families = timeout_s, output_chars, families
        self.answer: int | None = None

    def reset(self, seed: int) -> ResetReturn:
        question, self.answer = make_task(seed, self.families)
        return f"{question}\n{HOW}", {}

    def step(self, action: str) -> StepReturn:
        assert self.answer is not None, "reset() first"
        answers = _ANSWER.findall(action)
        if answers:
            right = check_answer(answers[-1], self.answer)
            verdict = "Correct." if right else "Wrong."
            return verdict, float(right), True, False, {"correct": right}
        blocks = _CODE.findall(action)
        if not blocks:
            text = f"No ```python block and no <answer> found. {HOW}"
            return text, 0.0, False, False, {"no_action": True}
        fenced, tagged = blocks[-1]
        result = self.executor.run(fenced or tagged, self.timeout_s)
        info: dict[str, Any] = {"exit_code": result.exit_code, "timed_out": result.timed_out}
        return show_output(result, self.output_chars), 0.0, False, False, info
