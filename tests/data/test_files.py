"""task.name=file: every format, the verl/TRL/messages layouts, field paths, and one-line errors."""

from __future__ import annotations

import json

import datasets
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from cadence.config import ConfigError, load_config
from cadence.data.build import build_task
from cadence.data.config import TaskConfig
from cadence.data.file_task import DataFileError, FileTask


def chat(question: str, system: str | None = None) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]


def verl_rows(n: int) -> list[dict]:
    return [
        {
            "data_source": "openai/gsm8k",
            "prompt": chat(f"{i}+1=?", system="Think."),
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(n)
    ]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def task(tmp_path, **fields) -> FileTask:
    return build_task(TaskConfig(name="file", **fields))


def test_verl_parquet_reads_messages_and_the_nested_answer(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(verl_rows(20)), path)
    t = task(tmp_path, train_file=str(path), test_fraction=0.25, prompt_suffix=" Answer:")
    test = t.prompts("test", 100)
    assert len(test) == 5
    p = t.prompts("train", 1)[0]
    i = p.meta["extra_info"]["index"]
    assert p.messages == [
        {"role": "system", "content": "Think."},
        {"role": "user", "content": f"{i}+1=? Answer:"},  # the suffix goes after the question
    ]
    assert p.text == f"Think.\n\n{i}+1=? Answer:" and p.answer == str(i + 1)
    assert p.id == f"train:{i + 1}" and p.meta["data_source"] == "openai/gsm8k"
    assert p.meta["reward_model"]["style"] == "rule" and "prompt" not in p.meta


def test_trl_jsonl_with_text_or_messages_prompts_and_a_solution_column(tmp_path):
    rows = [{"prompt": f"q{i}", "solution": f"{i}"} for i in range(5)]
    rows += [{"prompt": chat(f"m{i}"), "solution": f"{i}"} for i in range(5)]
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    test = write_jsonl(tmp_path / "test.jsonl", [{"prompt": chat("t"), "solution": 7.5}])
    t = task(tmp_path, train_file=train, test_file=test)
    prompts = t.prompts("train", 10)
    assert sorted(p.text for p in prompts) == sorted([f"q{i}" for i in range(5)] + [f"m{i}" for i in range(5)])
    assert all((p.messages is None) == p.text.startswith("q") for p in prompts)
    assert [(p.text, p.answer) for p in t.prompts("test", 5)] == [("t", "7.5")]


def test_messages_files_take_the_last_assistant_reply_as_the_answer(tmp_path):
    rows = [{"messages": chat(f"q{i}") + [{"role": "assistant", "content": f"a{i}"}], "id": i} for i in range(4)]
    train = write_jsonl(tmp_path / "chat.jsonl", rows)
    p = task(tmp_path, train_file=train).prompts("test", 1)[0]
    assert p.messages == chat(p.text) and p.answer == "a" + p.text[1:] and p.meta == {"id": int(p.text[1:])}
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"messages": chat("q")}])
    with pytest.raises(DataFileError, match=r"bad.jsonl:1: field 'messages' does not end with an assistant"):
        task(tmp_path, train_file=bad)


def test_csv_cells_stay_text_and_datasets_folders_and_json_arrays_read(tmp_path):
    csv = tmp_path / "train.csv"
    csv.write_text('question,answer\n"a, b",007\n"multi\nline",3\n')
    t = task(tmp_path, train_file=str(csv), prompt_field="question", test_fraction=0.5)
    assert sorted((p.text, p.answer) for p in t.prompts("train", 1) + t.prompts("test", 1)) == [
        ("a, b", "007"), ("multi\nline", "3")
    ]
    folder = tmp_path / "ds"
    datasets.Dataset.from_list([{"prompt": f"q{i}", "answer": str(i)} for i in range(6)]).save_to_disk(folder)
    assert len(task(tmp_path, train_file=str(folder)).prompts("train", 12)) == 12
    (tmp_path / "rows.json").write_text(json.dumps([{"prompt": "x", "answer": 1}, {"prompt": "y", "answer": 2}]))
    assert len(task(tmp_path, train_file=str(tmp_path / "rows.json")).prompts("test", 9)) == 1


def test_globs_and_lists_join_files_and_errors_name_the_right_file(tmp_path):
    for k in range(3):
        write_jsonl(tmp_path / f"part-{k}.jsonl", [{"prompt": f"p{k}{i}", "answer": i} for i in range(4)])
    t = task(tmp_path, train_file=str(tmp_path / "part-*.jsonl"), test_fraction=0.25)
    assert len({p.text for p in t.prompts("train", 100)}) == 9
    listed = task(tmp_path, train_file=[str(tmp_path / "part-0.jsonl"), str(tmp_path / "part-2.jsonl")])
    assert {p.id.split(":")[0] for p in listed.prompts("train", 50)} == {"part-0", "part-2"}
    write_jsonl(tmp_path / "part-3.jsonl", [{"prompt": "ok", "answer": 1}, {"prompt": "", "answer": 2}])
    with pytest.raises(DataFileError, match=r"part-3.jsonl:2: field 'prompt' is an empty prompt$"):
        task(tmp_path, train_file=str(tmp_path / "part-*.jsonl"))


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": 3, "answer": "a"}, "row 2: field 'prompt' must be a string or a list of chat messages, got int"),
        ({"prompt": [{"role": "robot", "content": "hi"}], "answer": "a"}, r"row 2: field 'prompt' message 0 must be"),
        ({"prompt": "  ", "answer": "a"}, r"row 2: field 'prompt' is an empty prompt"),
        ({"prompt": "q", "answer": ""}, r"row 2: field 'answer' is an empty answer"),
        ({"prompt": "q", "answer": [1]}, r"row 2: field 'answer' must be a string or number, got list"),
    ],
)
def test_a_bad_row_is_one_line_naming_file_row_and_field(tmp_path, row, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "fine", "answer": "ok"}, row])
    with pytest.raises(DataFileError, match=message.replace("row 2", "bad.jsonl:2")) as info:
        task(tmp_path, train_file=path)
    assert "\n" not in str(info.value)


def test_parquet_schema_and_row_errors(tmp_path):
    path = tmp_path / "v.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "q", "gold": "a"}] * 2), path)
    with pytest.raises(DataFileError, match=r"v.parquet: no column 'prompt' .*set task.prompt_field"):
        task(tmp_path, train_file=str(path))
    rows = verl_rows(3)
    rows[2]["reward_model"] = {"style": "rule", "ground_truth": None}
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(DataFileError, match=r"v.parquet row 3: field 'reward_model.ground_truth' must be a string"):
        task(tmp_path, train_file=str(path))


def test_config_load_errors_are_one_line(tmp_path):
    with pytest.raises(ValidationError, match="no file matches"):
        TaskConfig(name="file", train_file=str(tmp_path / "*.parquet"))
    (tmp_path / "data.txt").write_text("x")
    with pytest.raises(ValidationError, match="cannot tell the format of .*data.txt.*set task.format"):
        TaskConfig(name="file", train_file=str(tmp_path / "data.txt"))
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "q", "answer": "a"}, {"prompt": "q"}])
    with pytest.raises(ConfigError) as info:
        load_config(None, ["task.name=file", f"task.train_file={bad}"])
    assert str(info.value) == f"invalid task data: {bad}:2: missing field 'answer' (fields present: ['prompt'])"


def test_the_bulk_check_and_the_row_by_row_check_agree(tmp_path):
    """Rows Arrow proves valid skip `read_prompt`; their keys must be those `read_prompt`'s texts give."""
    from cadence.data.fields import read_prompt, resolve_layout
    from cadence.data.sources import open_file
    from cadence.data.tasks import stable_hash
    from cadence.data.text_keys import file_keys, hash_texts

    rows = verl_rows(5000)  # two scan batches: the second is a slice of the table
    plain = pa.Table.from_pylist(rows)
    roles = pc.dictionary_encode(pc.struct_field(plain["prompt"].combine_chunks().values, "role"))
    encoded = plain.set_column(1, "prompt", pa.ListArray.from_arrays(  # roles Arrow does not prove
        plain["prompt"].combine_chunks().offsets,
        pa.StructArray.from_arrays([roles, pc.struct_field(plain["prompt"].combine_chunks().values, "content")],
                                   names=["role", "content"])))
    texts = None
    for name, table in (("plain", plain), ("encoded", encoded)):
        pq.write_table(table, tmp_path / f"{name}.parquet")
        file = open_file(tmp_path / f"{name}.parquet", "parquet")
        layout = resolve_layout("auto", None, None, file.columns(), name)
        texts = texts or [read_prompt(r, layout, "", "").text for r in rows]
        assert (file_keys(file, layout, 5) == hash_texts(texts, 5)).all()
    assert hash_texts(["q"], 5)[0] == stable_hash("jsonl-holdout", 5, "q")  # the older jsonl task's split
    rows[4500]["prompt"] = [{"role": "user", "content": " "}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "bad.parquet")
    with pytest.raises(DataFileError, match=r"bad.parquet row 4501: field 'prompt' is an empty prompt"):
        task(tmp_path, train_file=str(tmp_path / "bad.parquet"))


def test_growing_train_draws_read_only_the_new_rows_and_match_a_fresh_draw(tmp_path):
    train = write_jsonl(tmp_path / "t.jsonl", [{"prompt": f"q{i}", "answer": i} for i in range(50)])
    fresh = task(tmp_path, train_file=train).prompts("train", 400)
    t = task(tmp_path, train_file=train)
    read = []
    rows_of = t._train.prompts
    t._train.prompts = lambda rows: read.append(len(rows)) or rows_of(rows)
    for n in (10, 45, 46, 200, 400):  # as a run draws block after block
        assert t.prompts("train", n) == fresh[:n]
    assert sum(read) == 400  # each row read once, not the whole prefix again every block
    assert [p.id.count("@") for p in fresh[44:46]] == [0, 1]  # 45 train rows: epoch 1 starts
    assert t.prompts("train", 10, seed=1) != fresh[:10] and t.prompts("train", 400) == fresh


def test_rows_taken_across_row_groups_come_back_in_the_order_asked(tmp_path):
    from cadence.data.sources import open_file

    path = tmp_path / "groups.parquet"
    pq.write_table(pa.table({"prompt": [f"q{i}" for i in range(100)], "answer": list(range(100))}), path,
                   row_group_size=30)
    rows = [99, 0, 31, 30, 29, 64, 0]
    assert [r["answer"] for r in open_file(path, "parquet").take(rows)] == rows
