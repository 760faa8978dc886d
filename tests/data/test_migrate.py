"""docs/migrate.md's cadence commands, run as written on small files in the verl, TRL, `datasets`
and CSV layouts (written here), with the tiny chat model and 2 steps."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cadence.config import load_config
from cadence.observe.metrics import read_jsonl
from cadence.recipes.train_rlvr import train
from tests.quick_run import QUICK_RUN

ROOT = Path(__file__).parents[2]
DOC = ROOT / "docs" / "migrate.md"
SMALL = [*QUICK_RUN, "trainer.steps=2", "model.path=builtin:calc", "rollout.max_new_tokens=8",
         "rollout.prompts_per_step=2", "rollout.group_size=2",
         "rollout.engine.backend=embedded", "trainer.mini_batches=1"]


def doc_commands() -> list[str]:
    """The `cadence train` commands of the page's bash blocks, continuation lines joined."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.DOTALL)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [" ".join(line.split()) for line in lines if line.startswith("cadence train")]


def question(i: int) -> str:
    return f"What is {i} + {i + 1}?"


def numbers(path: Path) -> range:
    """Train and test files hold different problems (training drops the test prompts)."""
    return range(100, 108) if "test" in path.name else range(12)


def verl_parquet(path: Path) -> None:
    rows = [{
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": question(i) + ' Output the final answer after "####".'}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(2 * i + 1)},
        "extra_info": {"split": path.stem, "index": i},
    } for i in numbers(path)]
    pq.write_table(pa.Table.from_pylist(rows), path)


def trl_jsonl(path: Path) -> None:
    rows = [{"prompt": [{"role": "user", "content": question(i)}], "solution": f"${2 * i + 1}$"} for i in numbers(path)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def datasets_folder(path: Path) -> None:
    rows = [{"prompt": question(i), "solution": str(2 * i + 1)} for i in numbers(path)]
    datasets.Dataset.from_list(rows).save_to_disk(path)


def csv_file(path: Path) -> None:
    path.write_text("question,answer\n" + "".join(f'"{question(i)}",{2 * i + 1}\n' for i in numbers(path)))


WRITERS = {
    "$HOME/data/gsm8k/train.parquet": verl_parquet,
    "$HOME/data/gsm8k/test.parquet": verl_parquet,
    "data/math/train.jsonl": trl_jsonl,
    "data/math_ds/train": datasets_folder,
    "data/math_ds/test": datasets_folder,
    "data/qa.csv": csv_file,
}
COMMANDS = doc_commands()


def data_files(command: str) -> list[str]:
    return re.findall(r"task\.(?:train|test)_file=(\S+)", command)


def test_the_page_trains_each_layout_and_the_test_writes_every_file_it_names():
    assert len(COMMANDS) == 4
    assert sorted({f for c in COMMANDS for f in data_files(c)}) == sorted(WRITERS)


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS, ids=[data_files(c)[0].split("/")[-2] for c in COMMANDS])
def test_a_migrate_command_trains_two_steps(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in data_files(command):
        path = Path(os.path.expandvars(name))
        path.parent.mkdir(parents=True, exist_ok=True)
        WRITERS[name](path)
    args = shlex.split(os.path.expandvars(command))[2:]
    cfg = load_config(None, [*args, *SMALL, f"logging.run_dir={tmp_path / 'run'}"])
    summary = train(cfg)
    records = read_jsonl(summary.run_dir / "metrics.jsonl")
    assert [r["step"] for r in records if "time/step" in r] == [1, 2]
    prompt = json.loads((summary.run_dir / "samples.jsonl").read_text().splitlines()[0])["prompt"]
    assert prompt.startswith("<|im_start|>user\nWhat is ")  # text or messages, through the chat template
