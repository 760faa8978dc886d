"""Reward functions: ``fn(prompt, response) -> float``, built by name.

Built-in rewards are small top-level classes rather than closures so that they
pickle: `RewardGuard` can then run them under any multiprocessing start method,
not only 'fork'. They may raise or hang on hostile input; containing that is
the guard's job, not theirs.

Constructors warm up (import math-verify / reasoning-gym, run one check) in
the calling process: forked guard workers inherit that, so a freshly restarted
worker does not spend its first timeout window importing sympy.
"""

from __future__ import annotations

import ast
import functools
import logging
import re
from collections.abc import Callable
from typing import Any

from cadence.data.tasks import Extract, Prompt

RewardFn = Callable[[Prompt, str], float]

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_GSM8K_NUMBER = re.compile(r"\$?\s*(-?[\d,]*\.?\d+)")
BOXED = "\\boxed"


def last_boxed(response: str) -> str:
    """The content of the last ``\\boxed{...}`` (braces nested to any depth), or "" if none closes."""
    start = response.rfind(BOXED)
    if start < 0:
        return ""
    rest = response[start + len(BOXED) :].lstrip()
    if not rest.startswith("{"):
        return ""
    depth = 0
    for i, char in enumerate(rest):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth == 0:
            return rest[1:i].strip()
    return ""


def after_hashes(response: str) -> str:
    """GSM8K's convention: the answer follows the last ``####``. A number there comes back
    without ``$`` or thousands commas (``#### $1,234`` -> ``1234``); other text, as written
    up to the end of its line; no ``####``: ""."""
    if "####" not in response:
        return ""
    line = response.rsplit("####", 1)[1].strip().split("\n", 1)[0].strip()
    number = _GSM8K_NUMBER.match(line)
    return number.group(1).replace(",", "") if number else line


def extract_answer(response: str, mode: Extract) -> str:
    """The part of `response` a built-in reward compares, stripped of whitespace.

    'answer_tag' takes the *last* tagged answer, so a response cannot list
    several guesses and have the first one checked. 'last_number' takes the last
    number on the first line, so worked steps may precede the answer. 'boxed' and
    'gsm8k' (`last_boxed`, `after_hashes`) give "" when the response lacks the
    marker: the format is part of the answer, as in verl's math and GSM8K scores.
    """
    if mode == "first_line":
        return next((line.strip() for line in response.splitlines() if line.strip()), "")
    if mode == "answer_tag":
        tagged = _ANSWER_TAG.findall(response)
        return (tagged[-1] if tagged else response).strip()
    if mode == "none":
        return response.strip()
    if mode == "last_number":
        # GSM8K-style: worked steps may come first, the final number is the answer.
        numbers = _NUMBER.findall(extract_answer(response, "first_line"))
        return numbers[-1] if numbers else ""
    if mode == "boxed":
        return last_boxed(response)
    if mode == "gsm8k":
        return after_hashes(response)
    raise ValueError(f"unknown extract mode {mode!r}")


class ExactMatch:
    """1.0 when the extracted answer equals the gold answer (both stripped), else 0.0."""

    def __init__(self, extract: Extract = "none") -> None:
        self.extract = extract

    def __call__(self, prompt: Prompt, response: str) -> float:
        return float(extract_answer(response, self.extract) == prompt.answer.strip())


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once that its timeout is off; `RewardGuard` enforces ours."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


@functools.lru_cache(maxsize=1)
def _quiet_math_verify() -> None:
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropTimeoutDisabledWarning())


def _parse_math(text: str) -> list:
    """math-verify's parse; bare LaTeX (``\\frac{\\pi}{4}``, as verl's MATH answers and
    boxed contents are written) is read again between ``$`` when plain parsing finds nothing."""
    from math_verify import parse

    return parse(text, parsing_timeout=None) or parse(f"${text}$", parsing_timeout=None)


@functools.lru_cache(maxsize=4096)
def _parse_gold(answer: str) -> list:
    return _parse_math(answer)


class MathVerify:
    """1.0 when math-verify finds the response equivalent to the gold answer.

    math-verify's own timeouts use signal.alarm, which only works in the main
    thread; they are disabled here (parsing_timeout / timeout_seconds = None)
    so this works in any thread, and the guard's process timeout bounds it.
    """

    def __init__(self, extract: Extract = "none") -> None:
        self.extract = extract
        self(Prompt("warm-up", "", "1/2"), "\\frac{1}{2}")  # ~0.7 s of imports, once

    def __call__(self, prompt: Prompt, response: str) -> float:
        from math_verify import verify

        _quiet_math_verify()
        gold = _parse_gold(prompt.answer)
        if not gold:
            raise ValueError(f"math-verify cannot parse the gold answer {prompt.answer!r}")
        answer = extract_answer(response, self.extract)
        if not answer:
            return 0.0
        return float(verify(gold, _parse_math(answer), timeout_seconds=None))


# Several reasoning-gym scorers run the model's answer through eval() or sympy's
# parse_expr (an eval): `__import__('os').system(...)` as a countdown answer
# executes. Worker processes contain crashes and hangs, not side effects, so
# answers these scorers would evaluate are first checked against what a
# legitimate answer can look like; anything else is scored as an empty answer.
_ARITHMETIC_ONLY = frozenset({"countdown", "puzzle24"})
_ARITHMETIC_TEXT = re.compile(r"[0-9+\-*/(). ]{0,300}")
_LITERAL_EVAL = frozenset({"string_insertion", "spiral_matrix", "binary_matrix", "n_queens"})
_SYMPY_EXPRESSION = frozenset(
    {"polynomial_multiplication", "simple_integration", "intermediate_integration"}
)
_EXPRESSION_TEXT = re.compile(r"[A-Za-z0-9+\-*/^()., ]{0,1000}")
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_VARIABLE = re.compile(r"[A-Za-z]\d*")
_MATH_NAMES = frozenset(
    "sin cos tan cot sec csc asin acos atan acot sinh cosh tanh coth asinh acosh atanh "
    "exp log ln sqrt cbrt pi E I oo Abs sign floor ceiling factorial erf gamma Integral "
    "Rational".split()
)


def defuse_answer(dataset: str, answer: str, entry: dict[str, Any]) -> str:
    """`answer`, or "" if the dataset's scorer would evaluate it as code."""
    if dataset in _ARITHMETIC_ONLY:
        ok = bool(_ARITHMETIC_TEXT.fullmatch(answer)) and "**" not in answer
    elif dataset in _SYMPY_EXPRESSION:
        ok = bool(_EXPRESSION_TEXT.fullmatch(answer)) and all(
            name in _MATH_NAMES or _VARIABLE.fullmatch(name) for name in _IDENTIFIER.findall(answer)
        )
    elif dataset in _LITERAL_EVAL:
        golds = {entry.get("answer"), *entry.get("metadata", {}).get("valid_answers", ())}
        ok = answer in golds or _is_literal(answer)
    else:
        ok = True
    return answer if ok else ""


def _is_literal(text: str) -> bool:
    """True when eval(text) can only build literals (lists, strings, numbers)."""
    try:
        ast.literal_eval(text)
    except Exception:  # SyntaxError, ValueError, RecursionError, MemoryError...
        return False
    return True


class ReasoningGymReward:
    """The reasoning-gym dataset's own `score_answer(answer, entry)`.

    The scorer comes from a dataset built with the task's kwargs, because some
    scorers read their config (puzzle24 checks value ranges). Scores can be
    partial: countdown gives 0.01 / 0.05 for wrong answers, and the default
    scorer gives len(gold)/len(answer) when the gold is a substring.
    """

    def __init__(
        self, extract: Extract = "answer_tag", kwargs_by_dataset: dict[str, dict] | None = None
    ) -> None:
        self.extract = extract
        self.kwargs_by_dataset = dict(kwargs_by_dataset or {})
        self._scorers: dict[str, Callable[[str, dict], float]] = {}
        import reasoning_gym  # noqa: F401  (warm-up, see the module docstring)

        for dataset in self.kwargs_by_dataset:
            self._scorer(dataset)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "extract": self.extract,
            "kwargs_by_dataset": self.kwargs_by_dataset,
            "_scorers": {},
        }

    def _scorer(self, dataset: str) -> Callable[[str, dict], float]:
        if dataset not in self._scorers:
            import reasoning_gym

            kwargs = self.kwargs_by_dataset.get(dataset, {})
            self._scorers[dataset] = reasoning_gym.create_dataset(
                dataset, size=1, seed=0, **kwargs
            ).score_answer
        return self._scorers[dataset]

    def __call__(self, prompt: Prompt, response: str) -> float:
        entry = prompt.meta.get("entry")
        if not isinstance(entry, dict):
            raise ValueError("the reasoning_gym reward needs prompt.meta['entry'] (an rg:* task)")
        dataset = entry["metadata"]["source_dataset"]
        answer = defuse_answer(dataset, extract_answer(response, self.extract), entry)
        return float(self._scorer(dataset)(answer, entry))
