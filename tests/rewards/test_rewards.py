"""Rewards: verifiers, user functions, and the guard that contains their failures."""

from __future__ import annotations

import math
import os
import sys
import threading
import time

import pytest
from pydantic import ValidationError

from cadence.data.build import build_task
from cadence.data.config import TaskConfig
from cadence.data.tasks import Prompt
from cadence.rewards.build import build_reward
from cadence.rewards.config import RewardConfig
from cadence.rewards.guard import RewardGuard, RewardOutcome
from cadence.rewards.python_reward import PythonReward, resolve_python_reward
from cadence.rewards.verifiers import ExactMatch, MathVerify, ReasoningGymReward, extract_answer


def P(answer: str, text: str = "q") -> Prompt:
    return Prompt(id="p", text=text, answer=answer, meta={})


# ------------------------------------------------------------------ exact match


def test_extract_modes():
    response = "  thinking\n<answer> 1 </answer> then <answer>42</answer>\n"
    assert extract_answer(response, "none") == response.strip()
    assert extract_answer(response, "first_line") == "thinking"
    assert extract_answer(response, "answer_tag") == "42"  # the last tag counts
    assert extract_answer("no tags here ", "answer_tag") == "no tags here"
    assert extract_answer("\n\n 7 \nmore", "first_line") == "7"
    assert extract_answer("", "first_line") == ""


@pytest.mark.parametrize(
    ("response", "boxed"),
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{2}} then \\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"),  # the last
        ("$\\boxed {x^{2} + \\{1, 2\\}}$", "x^{2} + \\{1, 2\\}"),  # nested; a space before {
        ("\\boxed{ 7 }", "7"),
        ("no box: 42", ""),
        ("\\boxed{1} and \\boxed{2", ""),  # the last one never closes
        ("\\boxed 5", ""),
    ],
)
def test_extract_boxed(response, boxed):
    assert extract_answer(response, "boxed") == boxed


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        ("3 + 4 = 7\n#### 7", "7"),
        ("#### 1,234.5 dollars", "1234.5"),
        ("#### $18.\nmore text", "18"),
        ("#### -3", "-3"),
        ("#### 5 #### 6", "6"),  # the last marker
        ("#### seven\n", "seven"),
        ("the answer is 7", ""),
        ("####", ""),
    ],
)
def test_extract_gsm8k(response, answer):
    assert extract_answer(response, "gsm8k") == answer


def test_math_verify_compares_boxed_and_bare_latex_golds(tmp_path):
    reward = MathVerify("boxed")
    assert reward(P("\\frac{\\pi}{4}"), "so it is \\boxed{\\frac{\\pi}{4}}") == 1.0  # verl MATH golds are bare LaTeX
    assert reward(P("0.5"), "\\boxed{1} no wait \\boxed{\\dfrac{1}{2}}") == 1.0
    assert reward(P("0.5"), "1/2 without a box") == 0.0
    assert MathVerify("gsm8k")(P("1234"), "#### 1,234") == 1.0
    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"prompt": "q{i}", "answer": "{i}"}}\n' for i in range(3)))
    task = build_task(TaskConfig(name="file", train_file=str(data)))
    assert build_reward(RewardConfig(name="math_verify"), task).extract == "boxed"
    assert build_reward(RewardConfig(name="math_verify", extract="gsm8k"), task).extract == "gsm8k"
    assert build_reward(RewardConfig(), task).extract == "answer_tag"  # exact_match keeps the tags


def test_exact_match_modes():
    assert ExactMatch("none")(P("82"), " 82\n") == 1.0
    assert ExactMatch("none")(P("82"), "82\n37+1=38") == 0.0
    assert ExactMatch("first_line")(P("82"), "82\n37+1=38") == 1.0
    assert ExactMatch("answer_tag")(P("82"), "so <answer>82</answer>") == 1.0
    assert ExactMatch("answer_tag")(P(" 82 "), "83") == 0.0


def test_auto_reward_follows_the_task():
    arith = build_task(TaskConfig())
    reward = build_reward(RewardConfig(), arith)
    assert isinstance(reward, ExactMatch) and reward.extract == "first_line"
    prompt = arith.prompts("test", 1)[0]
    assert reward(prompt, prompt.answer + "\n12+3=") == 1.0
    assert reward(prompt, prompt.answer + "1\n") == 0.0
    assert isinstance(
        build_reward(RewardConfig(name="math_verify", extract="none"), arith), MathVerify
    )
    with pytest.raises(ValueError, match="need a task"):
        build_reward(RewardConfig())


# ------------------------------------------------------------------ math-verify


@pytest.mark.parametrize(
    ("gold", "response", "expected"),
    [
        ("0.5", "1/2", 1.0),
        ("1/2", "0.5", 1.0),
        ("\\frac{1}{2}", "The answer is $0.5$", 1.0),
        ("0.5", "so \\boxed{\\frac{1}{2}}", 1.0),
        ("$x^2+2x+1$", "$(x+1)^2$", 1.0),
        ("0.5", "1/3", 0.0),
    ],
)
def test_math_verify_works_outside_the_main_thread(gold, response, expected):
    out: dict[str, object] = {}

    def run():
        try:
            out["value"] = MathVerify("none")(P(gold), response)
        except BaseException as exc:  # pragma: no cover - reported below
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert "error" not in out, out.get("error")
    assert out["value"] == expected


# ------------------------------------------------------------------ reasoning-gym


@pytest.mark.parametrize(
    ("dataset", "wrong"), [("countdown", "1 + 2"), ("basic_arithmetic", "123456789")]
)
def test_reasoning_gym_scores_gold_1_and_wrong_below_1(dataset, wrong):
    task = build_task(TaskConfig(name=f"rg:{dataset}", test_size=2))
    reward = build_reward(RewardConfig(), task)
    assert isinstance(reward, ReasoningGymReward)
    for prompt in task.prompts("train", 4):
        assert reward(prompt, prompt.answer) == 1.0
        assert reward(prompt, f"Let me think.\n<answer>{prompt.answer}</answer>") == 1.0
        assert reward(prompt, wrong) < 1.0
        assert reward(prompt, "") < 1.0


# reasoning-gym scorers that eval() or sympy-parse the answer (checked on 0.1.25).
EVALUATING_SCORERS = [
    "countdown",
    "puzzle24",
    "string_insertion",
    "spiral_matrix",
    "binary_matrix",
    "n_queens",
    "polynomial_multiplication",
    "simple_integration",
    "intermediate_integration",
]


@pytest.mark.parametrize("dataset", EVALUATING_SCORERS)
def test_reasoning_gym_scorers_never_evaluate_code(dataset, tmp_path):
    task = build_task(TaskConfig(name=f"rg:{dataset}", test_size=1))
    reward = build_reward(RewardConfig(), task)
    prompts = task.prompts("train", 2)
    assert all(reward(p, p.answer) == 1.0 for p in prompts)  # gold still scores
    marker = tmp_path / "pwned"
    code = f"__import__('os').system('touch {marker}')"
    for attack in (code, f"[{code}]", f"eval({code!r})", "sympify(chr(95))"):
        assert reward(prompts[0], attack) < 1.0
    assert not marker.exists()


def test_reasoning_gym_reward_needs_an_entry():
    with pytest.raises(ValueError, match="meta\\['entry'\\]"):
        ReasoningGymReward()(P("1"), "1")


# ------------------------------------------------------------------ python: rewards


USER_REWARDS = """
def length_reward(prompt, response):
    return len(response) / 10

def one_arg(prompt):
    return 1.0

NOT_A_FUNCTION = 3
"""


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(USER_REWARDS)
    return path


def test_python_reward_from_a_file_and_a_module(reward_file, monkeypatch):
    reward = build_reward(RewardConfig(name=f"python:{reward_file}:length_reward"))
    assert isinstance(reward, PythonReward) and reward(P("x"), "abcde") == 0.5
    monkeypatch.syspath_prepend(str(reward_file.parent))
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    assert resolve_python_reward("python:my_rewards:length_reward")(P("x"), "a") == 0.1
    assert RewardConfig(name="python:os.path:join").name == "python:os.path:join"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "python:{file}:lenght_reward",
            "has no function 'lenght_reward'. Did you mean: length_reward",
        ),
        ("python:{file}:NOT_A_FUNCTION", "is a int, not a function"),
        ("python:{file}:one_arg", "must accept \\(prompt, response\\)"),
        ("python:{dir}/missing.py:f", "file not found"),
        (
            "python:no_such_module_xyz:f",
            "importing 'no_such_module_xyz' failed: ModuleNotFoundError",
        ),
        ("python:justafunction", "expected 'python:module.path:function'"),
    ],
)
def test_python_reward_spec_errors(reward_file, spec, message):
    spec = spec.format(file=reward_file, dir=reward_file.parent)
    with pytest.raises(ValidationError, match=message) as info:
        RewardConfig(name=spec)
    assert f"reward.name {spec!r}" in str(info.value)


def test_reward_config_rejects_unknown_names():
    with pytest.raises(ValidationError, match="'exact_match'"):
        RewardConfig(name="exact")
    with pytest.raises(ValidationError):
        RewardConfig(extract="last_line")
    assert all(f.description for f in RewardConfig.model_fields.values())


def test_python_reward_module_that_fails_to_import(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("raise RuntimeError('boom at import')\n")
    with pytest.raises(ValueError, match="RuntimeError: boom at import"):
        resolve_python_reward(f"python:{bad}:f")


# ------------------------------------------------------------------ guard


def good(prompt: Prompt, response: str) -> float:
    return float(response == prompt.answer)


def flaky(prompt: Prompt, response: str) -> float:
    if response == "raise":
        raise ValueError("bad response")
    if response == "hang":
        time.sleep(60)
    if response == "exit":
        os._exit(3)
    if response == "nan":
        return math.nan
    if response == "str":
        return "1.0"  # type: ignore[return-value]
    return float(response == prompt.answer)


@pytest.fixture
def guard():
    with RewardGuard(flaky, timeout_s=0.5, workers=1) as g:
        yield g


def test_guard_scores_in_order(guard):
    pairs = [(P(str(i)), str(i if i % 3 else -1)) for i in range(200)]
    outcomes = guard.score(pairs)
    assert [o.reward for o in outcomes] == [float(i % 3 != 0) for i in range(200)]
    assert all(o.error is None and o.seconds >= 0 for o in outcomes)
    assert guard.stats()["calls"] == 200 and guard.stats()["pending"] == 0


def test_guard_counts_a_raising_function(guard):
    outcome = guard.score([(P("1"), "raise")])[0]
    assert (
        isinstance(outcome, RewardOutcome)
        and outcome.reward == 0.0
        and "ValueError: bad response" in outcome.error
    )
    stats = guard.stats()
    assert stats["errors"] == 1 and stats["error_types"] == {"ValueError": 1}
    assert stats["last_error"] == "ValueError: bad response" and stats["timeouts"] == 0
    assert guard.score([(P("1"), "1")])[0].reward == 1.0


def test_guard_rejects_non_finite_and_non_numeric(guard):
    nan, text = guard.score([(P("1"), "nan"), (P("1"), "str")])
    assert nan.reward == 0.0 and "nan" in nan.error
    assert text.reward == 0.0 and "str" in text.error
    assert guard.stats()["error_types"] == {"NonFiniteReward": 1, "NonNumericReward": 1}


def test_guard_kills_a_hanging_function_and_keeps_working(guard):
    start = time.monotonic()
    outcome = guard.score([(P("1"), "hang")])[0]
    assert time.monotonic() - start < 10
    assert outcome.reward == 0.0 and outcome.error.startswith("Timeout")
    assert guard.stats()["timeouts"] == 1 and guard.stats()["errors"] == 0
    assert guard.score([(P("2"), "2")])[0].reward == 1.0
    # A hang inside a batch only costs that pair: the rest are re-queued and scored.
    outcomes = guard.score([(P("1"), "1"), (P("1"), "hang"), (P("2"), "2"), (P("3"), "x")])
    assert [o.reward for o in outcomes] == [1.0, 0.0, 1.0, 0.0]
    assert outcomes[1].error.startswith("Timeout") and outcomes[3].error is None
    stats = guard.stats()
    assert stats["timeouts"] == 2 and stats["restarts"] == 2 and stats["pending"] == 0


def test_guard_survives_a_dying_worker(guard):
    outcomes = guard.score([(P("1"), "1"), (P("1"), "exit"), (P("2"), "2")])
    assert [o.reward for o in outcomes] == [1.0, 0.0, 1.0]
    assert "exit code 3" in outcomes[1].error
    assert guard.stats()["error_types"] == {"WorkerDied": 1}


def test_guard_parallel_workers_and_futures():
    with RewardGuard(good, timeout_s=5, workers=2) as g:
        futures = [g.submit(P(str(i)), str(i)) for i in range(50)]
        assert all(f.result(timeout=30).reward == 1.0 for f in futures)
        assert g.score([]) == []
    with pytest.raises(RuntimeError, match="closed"):
        g.submit(P("1"), "1")


def test_guard_from_config_with_math_verify():
    cfg = RewardConfig(name="math_verify", timeout_s=10.0, extract="none")
    with RewardGuard(build_reward(cfg, build_task(TaskConfig())), cfg.timeout_s, cfg.workers) as g:
        a, b = g.score([(P("0.5"), "\\frac{1}{2}"), (P("0.5"), "3")])
    assert (a.reward, b.reward) == (1.0, 0.0) and a.error is None
