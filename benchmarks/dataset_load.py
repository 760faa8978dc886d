"""How fast a large data file starts training, and in how much memory (task.name=file).

Writes N-row files (default 1M) in the layouts people bring, a verl parquet (prompt as chat
messages, reward_model.ground_truth, data_source, extra_info), the same rows as TRL-style
JSONL and as a `datasets` folder, then, for each, in a fresh process: builds the task (the
validating pass and the held-out split, what `cadence train` does before the model loads)
and draws the first block of training prompts (3,200, what the rollout asks for first) and
the test prompts. It reports seconds to that first block and the peak RSS above the
process's RSS before loading (after imports). A last row keeps every JSONL row as a Python dict, the cost
of not reading lazily, for comparison.

    python benchmarks/dataset_load.py                      # 1M rows, ~3 min on 2 quiet cores
    python benchmarks/dataset_load.py --rows 20000 --quick # a smoke run; writes nothing under docs/
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIRST_BLOCK = 3200  # cadence.assemble.PROMPT_BLOCK: the prompts a run draws first
SYSTEM = "Let's think step by step and output the final answer after ####."


def write_files(rows: int, folder: Path) -> dict[str, Path]:
    """The verl parquet, TRL JSONL and datasets folder of `rows` GSM8K-sized problems."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 10**6, rows), rng.integers(0, 10**6, rows)
    questions = [
        f"A shop sold {x} apples in the morning and {y} apples in the afternoon. How many apples did it sell in all?"
        for x, y in zip(a.tolist(), b.tolist(), strict=True)
    ]
    answers = pa.array([str(s) for s in (a + b).tolist()])
    content = [text for question in questions for text in (SYSTEM, question)]
    messages = pa.StructArray.from_arrays(
        [pa.array(["system", "user"] * rows), pa.array(content)], names=["role", "content"]
    )
    prompt = pa.ListArray.from_arrays(pa.array(np.arange(0, 2 * rows + 1, 2, dtype=np.int32)), messages)
    table = pa.table({
        "data_source": pa.array(["openai/gsm8k"] * rows),
        "prompt": prompt,
        "ability": pa.array(["math"] * rows),
        "reward_model": pa.StructArray.from_arrays([pa.array(["rule"] * rows), answers], names=["style", "ground_truth"]),
        "extra_info": pa.StructArray.from_arrays([pa.array(np.arange(rows))], names=["index"]),
    })
    paths = {"parquet": folder / "train.parquet", "jsonl": folder / "train.jsonl", "datasets": folder / "train_ds"}
    pq.write_table(table, paths["parquet"], row_group_size=100_000)
    with paths["jsonl"].open("w") as out:
        for question, answer in zip(questions, answers.to_pylist(), strict=True):
            out.write(json.dumps({"prompt": [{"role": "user", "content": question}], "answer": answer}) + "\n")
    import datasets

    datasets.disable_progress_bars()
    datasets.Dataset(table).save_to_disk(paths["datasets"])
    return paths


def rss_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (the peak) of this process, in MB."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def measure(path: str, how: str) -> dict:
    """In this (fresh) process: time and memory to the first block of training prompts."""
    import pyarrow.compute  # noqa: F401  (imports are not what is measured)
    import pyarrow.json  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    from cadence.data.build import build_task
    from cadence.data.config import TaskConfig

    before = rss_mb("VmRSS")
    if how == "dicts":
        start = time.perf_counter()
        with open(path) as handle:
            rows = [json.loads(line) for line in handle]
        return {"rows": len(rows), "first_block_s": time.perf_counter() - start, "peak_rss_mb": rss_mb("VmHWM") - before}
    start = time.perf_counter()
    task = build_task(TaskConfig(name="file", train_file=path))
    loaded = time.perf_counter() - start
    train, test = task.prompts("train", FIRST_BLOCK), task.prompts("test", 200)
    assert len(train) == FIRST_BLOCK and len(test) == 200
    return {
        "load_s": loaded,
        "first_block_s": time.perf_counter() - start,
        "peak_rss_mb": rss_mb("VmHWM") - before,
    }


def run_case(path: Path, how: str) -> dict:
    """`measure` in a fresh interpreter, so each case's peak RSS is its own."""
    out = subprocess.run(
        [sys.executable, __file__, "--measure", str(path), how],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="a smoke run: print, write nothing under docs/")
    # the table goes into docs/migrate.md between <!-- dataset_load-table-start/end --> markers
    parser.add_argument("--out", default="docs/results/dataset_load.json")
    parser.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_files(args.rows, Path(tmp))
        sizes = {k: sum(f.stat().st_size for f in ([p] if p.is_file() else p.iterdir())) for k, p in paths.items()}
        cases = [
            ("verl parquet", paths["parquet"], "task", sizes["parquet"]),
            ("`datasets` folder", paths["datasets"], "task", sizes["datasets"]),
            ("TRL-style JSONL", paths["jsonl"], "task", sizes["jsonl"]),
            ("JSONL, only `json.loads` of every line into a list of dicts (what a loader that keeps "
             "rows does before any check)", paths["jsonl"], "dicts", sizes["jsonl"]),
        ]
        results = []
        for name, path, how, size in cases:
            result = {"case": name, "file_mb": round(size / 2**20, 1), **run_case(path, how)}
            results.append(result)
            print(json.dumps(result), flush=True)
    table = "\n".join([
        f"{args.rows:,} rows, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs:",
        "",
        "| file | size MB | seconds to the first 3,200 prompts | peak RSS above start, MB |",
        "|---|---|---|---|",
        *(f"| {r['case']} | {r['file_mb']} | {r['first_block_s']:.1f} | {r['peak_rss_mb']:.0f} |" for r in results),
    ])
    print("\n" + table)
    if not args.quick:
        from cadence.observe.report import write_doc_table

        write_doc_table(ROOT / "docs" / "migrate.md", "dataset_load", table)
        record = {
            "command": "python benchmarks/dataset_load.py" + (f" --rows {args.rows}" if args.rows != 1_000_000 else ""),
            "rows": args.rows, "cpus": os.cpu_count(), "load_average": os.getloadavg(), "results": results,
        }
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
