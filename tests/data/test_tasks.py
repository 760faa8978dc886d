"""Prompt sources: determinism, disjoint splits, and load-time error messages."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from cadence.data.arithmetic import TERMINATOR, ArithmeticTask
from cadence.data.build import build_task
from cadence.data.config import TaskConfig
from cadence.data.file_task import DataFileError, FileTask
from cadence.data.reasoning_gym import ReasoningGymTask
from cadence.data.tasks import Task

# ------------------------------------------------------------------ arith


def test_arith_is_the_default_and_deterministic():
    task = build_task(TaskConfig())
    assert isinstance(task, ArithmeticTask) and isinstance(task, Task)
    again = build_task(TaskConfig())
    assert task.prompts("train", 50, 3) == again.prompts("train", 50, 3)
    assert task.prompts("test", 50, 3) == again.prompts("test", 50, 3)
    assert task.prompts("train", 50, 3) != task.prompts("train", 50, 4)
    assert task.sft_examples(20, 1) == again.sft_examples(20, 1)


def test_arith_answers_are_correct_and_can_be_negative():
    prompts = build_task(
        TaskConfig(kwargs={"operations": ["+", "-"], "digits": 2, "pad_operands": False})
    ).prompts("train", 500, 0)
    for p in prompts:
        assert p.text.endswith("=")
        a, op, b = p.meta["a"], p.meta["op"], p.meta["b"]
        assert p.text == f"{a}{op}{b}="
        assert int(p.answer) == (a + b if op == "+" else a - b)
        assert 0 <= a < 100 and 0 <= b < 100
    assert any(p.answer.startswith("-") for p in prompts)
    assert {p.meta["op"] for p in prompts} == {"+", "-"}


def test_arith_train_and_test_are_disjoint():
    task = build_task(
        TaskConfig(kwargs={"digits": 1, "operations": ["+", "-", "*"]}, test_size=100)
    )
    test = task.prompts("test", 1000, 7)
    assert len(test) == 100  # at most test_size
    assert len({p.text for p in test}) == 100  # distinct
    train_texts = {p.text for p in task.prompts("train", 3000, 7)}
    assert train_texts.isdisjoint(p.text for p in test)
    # Only 300 problems exist: train still covers everything not held out.
    assert len(train_texts) == 200
    assert task.prompts("test", 10, 7) == test[:10]  # a prefix, whatever n asks


def test_arith_sft_uses_the_terminator_and_avoids_test():
    task = build_task(
        TaskConfig(kwargs={"digits": 1, "operations": ["+", "-"]}, test_size=50)
    )
    assert task.stop == (TERMINATOR,) == ("\n",)
    test_texts = {p.text for p in task.prompts("test", 50, 0)}
    examples = task.sft_examples(400, 0)
    assert len(examples) == 400
    for prompt, completion in examples:
        assert completion.endswith(TERMINATOR) and TERMINATOR not in completion[: -len(TERMINATOR)]
        a, rest = prompt[:-1].split("+") if "+" in prompt else prompt[:-1].split("-", 1)
        expected = int(a) + int(rest) if "+" in prompt else int(a) - int(rest)
        assert int(completion[:-1]) == expected
        assert prompt not in test_texts


def test_arith_sft_carry_slip_forgets_only_carries():
    from cadence.data.arithmetic import sum_without_carries

    assert sum_without_carries(37, 45) == 72
    assert sum_without_carries(58, 67) == 115
    assert sum_without_carries(99, 1) == 90
    assert sum_without_carries(12, 34) == 46  # no carry: nothing to forget
    task = build_task(TaskConfig(kwargs={"sft_carry_slip": 0.6}))
    examples = task.sft_examples(2000, 0)
    carrying = slipped = 0
    for prompt, completion in examples:
        a, b = map(int, prompt[:-1].split("+"))  # int() reads "07" as 7
        got = int(completion)
        assert got in (a + b, sum_without_carries(a, b))
        if sum_without_carries(a, b) != a + b:
            carrying += 1
            slipped += got != a + b
    assert 0.55 < slipped / carrying < 0.65
    # the test split is never slipped
    assert all(int(p.answer) == p.meta["a"] + p.meta["b"] for p in task.prompts("test", 200))


def test_arith_prompt_suffix_and_split_name():
    task = build_task(TaskConfig(prompt_suffix=" "))
    assert all(p.text.endswith("= ") for p in task.prompts("test", 5))
    with pytest.raises(ValueError, match="split"):
        task.prompts("validation", 5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"digits": 0}, "task.kwargs.digits"),
        ({"operations": ["/"]}, "task.kwargs.operations"),
        ({"operations": []}, "task.kwargs.operations"),
        ({"bogus": 1}, "task.kwargs.bogus"),
        ({"digits": 1, "operations": ["+"]}, "task.test_size"),  # 100 problems, 200 held out
    ],
)
def test_arith_config_errors(kwargs, message):
    with pytest.raises(ValidationError, match=message):
        TaskConfig(kwargs=kwargs)


def test_task_config_rejects_unknown_fields_and_names():
    with pytest.raises(ValidationError, match="extra"):
        TaskConfig(nmae="arith")
    with pytest.raises(ValidationError, match="rg:<reasoning-gym dataset>"):
        TaskConfig(name="countdown")
    with pytest.raises(ValidationError, match="task.train_file is only used"):
        TaskConfig(name="arith", train_file="x.jsonl")


def test_every_field_has_a_description():
    assert all(f.description for f in TaskConfig.model_fields.values())


# ------------------------------------------------------------------ jsonl


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_jsonl_loads_and_holds_out_deterministically(tmp_path):
    rows = [{"prompt": f"q{i}", "answer": i, "source": "s"} for i in range(100)]
    rows.append({"prompt": "q5", "answer": 5})  # a duplicate text never straddles the split
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    cfg = TaskConfig(name="jsonl", train_file=str(path), test_fraction=0.2, seed=1)
    task = build_task(cfg)
    assert isinstance(task, FileTask)
    test = task.prompts("test", 1000)
    assert len(test) == 20
    train = task.prompts("train", 250)
    assert len(train) == 250  # cycles through epochs
    assert {p.text for p in train}.isdisjoint(p.text for p in test)
    assert len({p.text for p in train}) == 80
    assert len({p.id for p in train}) == 250
    assert test == build_task(cfg).prompts("test", 1000)
    assert train[0].meta == {"source": "s"} and train[0].answer == train[0].text[1:]
    other = build_task(cfg.model_copy(update={"seed": 2})).prompts("test", 1000)
    assert {p.text for p in other} != {p.text for p in test}


def test_jsonl_test_file_and_custom_fields(tmp_path):
    train = write_jsonl(tmp_path / "a.jsonl", [{"q": f"x{i}", "a": "y"} for i in range(10)])
    test = write_jsonl(tmp_path / "b.jsonl", [{"q": "x3", "a": "y"}, {"q": "z", "a": "w"}])
    cfg = TaskConfig(
        name="jsonl",
        train_file=str(train),
        test_file=str(test),
        prompt_field="q",
        answer_field="a",
        prompt_suffix="!",
    )
    task = build_task(cfg)
    assert [p.text for p in task.prompts("test", 10)] == ["x3!", "z!"]
    train_texts = {p.text for p in task.prompts("train", 30)}
    assert len(train_texts) == 9 and "x3!" not in train_texts


def load_jsonl(path):
    return build_task(TaskConfig(name="jsonl", train_file=str(path)))


def test_jsonl_missing_field_names_file_line_and_field(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "answer": "b"}, "", {"prompt": "c"}])
    with pytest.raises(DataFileError) as info:
        load_jsonl(path)
    message = str(info.value)
    assert f"{path}:3" in message and "'answer'" in message and "missing" in message


def test_jsonl_bad_json_line(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "answer": "b"}, '{"prompt": "c",'])
    with pytest.raises(DataFileError, match=rf"{path}:2: invalid JSON"):
        load_jsonl(path)
    with pytest.raises(DataFileError, match="expected a JSON object"):
        load_jsonl(write_jsonl(tmp_path / "e.jsonl", [{"prompt": "a", "answer": "b"}, "[1, 2]"]))
    with pytest.raises(DataFileError, match="must be a string or number"):
        load_jsonl(write_jsonl(tmp_path / "f.jsonl", [{"prompt": "a", "answer": None}]))


def test_jsonl_config_errors(tmp_path):
    with pytest.raises(ValidationError, match="task.train_file"):
        TaskConfig(name="jsonl")
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(ValidationError, match=f"task.train_file: file not found: {missing}"):
        TaskConfig(name="jsonl", train_file=str(missing))
    train = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "a", "answer": "b"}])
    with pytest.raises(ValidationError, match="task.test_file: file not found"):
        TaskConfig(name="jsonl", train_file=str(train), test_file=str(missing))
    with pytest.raises(DataFileError, match="at least 2 distinct"):
        build_task(TaskConfig(name="jsonl", train_file=str(train)))


# ------------------------------------------------------------------ reasoning-gym


@pytest.mark.parametrize("dataset", ["countdown", "basic_arithmetic"])
def test_reasoning_gym_splits_are_disjoint_and_deterministic(dataset):
    cfg = TaskConfig(name=f"rg:{dataset}", test_size=8, seed=5, prompt_suffix="\nAnswer:")
    task = build_task(cfg)
    assert isinstance(task, ReasoningGymTask) and task.default_reward == "reasoning_gym"
    test, train = task.prompts("test", 100), task.prompts("train", 12)
    assert len(test) <= 8 and len(train) == 12
    assert {p.text for p in train}.isdisjoint(p.text for p in test)
    assert train == build_task(cfg).prompts("train", 12)
    for p in train:
        entry = p.meta["entry"]
        assert p.text == entry["question"] + "\nAnswer:" and p.answer == entry["answer"]
        assert entry["metadata"]["source_dataset"] == dataset
        json.dumps(p.meta)  # JSON-serialisable


def test_reasoning_gym_kwargs_pass_through():
    task = build_task(
        TaskConfig(name="rg:countdown", kwargs={"min_numbers": 3, "max_numbers": 3}, test_size=2)
    )
    assert all(len(p.meta["entry"]["metadata"]["numbers"]) == 3 for p in task.prompts("train", 4))


def test_reasoning_gym_config_errors():
    with pytest.raises(ValidationError, match="Did you mean: rg:countdown"):
        TaskConfig(name="rg:countdwn")
    with pytest.raises(ValidationError, match="not options of reasoning-gym dataset 'countdown'"):
        TaskConfig(name="rg:countdown", kwargs={"min_numbrs": 3})
    with pytest.raises(ValidationError, match="set by cadence"):
        TaskConfig(name="rg:countdown", kwargs={"seed": 3})
    with pytest.raises(ValidationError, match="rejected by reasoning-gym"):
        TaskConfig(name="rg:countdown", kwargs={"min_numbers": 5, "max_numbers": 2})
