"""The dashboard's readers: incremental tails, run status, timeline spans, the sample log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cadence.dashboard.runs import RunIndex, RunReader, turns
from cadence.dashboard.tail import JsonlTail, last_record
from cadence.observe.events import EVENTS_DIR, Timeline
from cadence.observe.run_status import RunStatus, read_status
from cadence.observe.sample_log import OLD_SAMPLES_FILE, SAMPLES_FILE, SampleLog
from tests.dashboard.conftest import CharTokenizer, group, write_run


def test_tail_reads_only_new_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n')
    tail = JsonlTail(path)
    assert [r["step"] for r in tail.read()] == [1, 2]
    assert tail.read() == []
    with path.open("a") as f:
        f.write('{"step": 3}\n{"st')  # the writer is mid-line
    assert [r["step"] for r in tail.read()] == [3]
    with path.open("a") as f:
        f.write('ep": 4}\n')
    assert [r["step"] for r in tail.read()] == [4] and not tail.reset
    path.write_text('{"step": 1}\n')  # cut back (a resume): start over
    assert [r["step"] for r in tail.read()] == [1] and tail.reset
    assert last_record(path) == {"step": 1}
    assert last_record(tmp_path / "missing.jsonl") is None


def test_tail_starts_over_on_a_replaced_file(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n')
    tail = JsonlTail(path)
    tail.read()
    new = tmp_path / "new.jsonl"
    new.write_text('{"a": 3}\n{"a": 4}\n{"a": 5}\n')
    os.replace(new, path)  # rotation: another inode, even though it is longer
    assert [r["a"] for r in tail.read()] == [3, 4, 5] and tail.reset


def test_status_running_finished_failed_and_killed(tmp_path: Path) -> None:
    status = RunStatus(tmp_path)
    status.start()
    assert read_status(tmp_path)["state"] == "running"
    status.finish()
    assert read_status(tmp_path)["state"] == "finished"
    try:
        raise ValueError("reward function exploded\nfor the last time")
    except ValueError as err:
        status.failed(err)
    got = read_status(tmp_path)
    assert got["state"] == "failed" and got["error"] == "ValueError: for the last time"
    assert "raise ValueError" in got["traceback"]
    # A process that wrote `running` and died without a word.
    code = "import sys; from pathlib import Path; from cadence.observe.run_status import RunStatus; RunStatus(Path(sys.argv[1])).start()"
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True)
    got = read_status(tmp_path)
    assert got["state"] == "failed" and "without a status" in got["error"]


def test_status_of_runs_from_before_status_json(tmp_path: Path) -> None:
    assert read_status(tmp_path)["state"] == "unknown"
    (tmp_path / "summary.json").write_text("{}")
    assert read_status(tmp_path)["state"] == "finished"


def test_timeline_writes_one_span_per_change_of_state(tmp_path: Path) -> None:
    timeline = Timeline(tmp_path, "rollout-0", flush_s=60.0)
    for state in ["generating", "generating", "generating", "weight_sync", "generating", "waiting"]:
        timeline.enter(state)
    path = tmp_path / EVENTS_DIR / "rollout-0.jsonl"
    assert path.read_text() == ""  # buffered: nothing on disk before flush_s or close
    timeline.close()
    spans = [json.loads(line) for line in path.read_text().splitlines()]
    assert [s["state"] for s in spans] == ["generating", "weight_sync", "generating", "waiting"]
    assert all(s["t0"] <= s["t1"] for s in spans)
    assert all(a["t1"] == b["t0"] for a, b in zip(spans, spans[1:], strict=False))


def test_timeline_outside_a_run_writes_nothing(tmp_path: Path) -> None:
    for run_dir in (None, tmp_path / "not-created"):
        timeline = Timeline(run_dir, "trainer")
        timeline.enter("training", 1)
        timeline.close()
    assert not (tmp_path / "not-created").exists()


def test_sample_log_every_kth_step_and_bounded(tmp_path: Path) -> None:
    log = SampleLog(tmp_path, CharTokenizer(), every=2, groups=1, max_lines=5)
    for step in range(1, 13):
        log.log(step, step - 1, [group(step, step, [1.0, 0.0], step - 1), group(step, 100 + step, [1.0], step - 1)])
    log.close()
    new = [json.loads(line) for line in (tmp_path / SAMPLES_FILE).read_text().splitlines()]
    old = [json.loads(line) for line in (tmp_path / OLD_SAMPLES_FILE).read_text().splitlines()]
    # Steps 2 and 4 rotated away: between max_lines and 2 x max_lines recent lines; first group only.
    assert [r["step"] for r in old + new] == [6, 6, 8, 8, 10, 10, 12, 12]
    assert len(new) <= 5 and len(old) <= 5
    first = new[0]
    assert first["prompt"] == "1+1=" and first["response"] == "42" and first["tokens"] == ["4", "2"]
    assert first["loss_mask"] == [1, 1] and first["staleness"] == 0 and first["group_rewards"] == [1.0, 0.0]


def test_reader_series_are_thinned_but_keep_sparse_keys_and_the_last_point(tmp_path: Path) -> None:
    run = tmp_path / "r"
    run.mkdir()
    rows = [{"step": s, "reward/mean": s * 0.1, **({"eval/pass@1": 0.5} if s % 250 == 0 else {})} for s in range(1, 1001)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    reader = RunReader(run)
    reader.refresh()
    out = reader.series(None, max_points=100)["series"]
    assert set(out) == {"reward/mean", "eval/pass@1"}
    assert len(out["reward/mean"]["x"]) <= 101 and out["reward/mean"]["x"][-1] == 1000
    assert out["eval/pass@1"]["x"] == [250, 500, 750, 1000]
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 1001, "reward/mean": 1.0}) + "\n")
    reader.refresh()
    assert [r["step"] for r in reader.new_rows(1000)] == [1001]


def test_reader_timeline_samples_and_turns(runs_root: Path) -> None:
    write_run(runs_root, "agent", steps=3, mask=[1, 1, 0, 1])
    reader = RunIndex(runs_root).reader("agent")
    reader.refresh()
    timeline = reader.timeline()
    assert [s["step"] for s in timeline["spans"]["trainer"]] == [1, 2, 3]
    assert timeline["staleness"] == {0: 9, 1: 3} and timeline["alpha"] == 1
    groups = reader.sample_groups()
    assert [g["step"] for g in groups] == [3, 2, 1] and groups[0]["turns"] == 3
    samples = reader.group(3, 3)
    assert [s["reward"] for s in samples] == [1.0, 0.0]
    assert [(t["role"], "".join(t["tokens"])) for t in samples[0]["turns"]] == [("model", "ab"), ("env", "\n"), ("model", "c")]
    assert [t.get("reward") for t in samples[0]["turns"]] == [0.5, None, 0.5]  # logged by SampleLog, read back
    assert turns({"tokens": ["4", "2"], "loss_mask": [1, 1]})[0]["tokens"] == ["4", "2"]
    paid = turns({"tokens": list("ab\nc"), "loss_mask": [1, 1, 0, 1], "turn_rewards": [[1, 0.5], [3, 1.0]]})
    assert [t.get("reward") for t in paid] == [0.5, None, 1.0]


def test_index_lists_runs_without_parsing_metrics(runs_root: Path) -> None:
    write_run(runs_root, "live", steps=3, finish=False)
    (runs_root / "not-a-run").mkdir()
    rows = {r["name"]: r for r in RunIndex(runs_root).runs()}
    assert set(rows) == {"done", "live"}
    assert rows["done"]["state"] == "finished" and rows["done"]["step"] == 5 and rows["done"]["steps"] == 5
    assert rows["live"]["state"] == "running" and rows["live"]["reward"] == 1.0
    index = RunIndex(runs_root)
    assert index.reader("../etc") is None and index.reader("not-a-run") is None


def test_resume_cuts_samples_and_step_records_back_to_the_checkpoint(tmp_path):
    """A killed run logged steps 1-3 but checkpointed at 2: the resumed run redoes step 3, so the
    old step-3 samples and staleness record go, and the spans (real time spent) stay."""
    import json

    from cadence.observe.events import cut_back
    from cadence.observe.sample_log import OLD_SAMPLES_FILE, SAMPLES_FILE, SampleLog

    (tmp_path / SAMPLES_FILE).write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)) + '{"step": 3, "to')
    (tmp_path / OLD_SAMPLES_FILE).write_text(json.dumps({"step": 1}) + "\n")
    SampleLog(tmp_path, tokenizer=None, every=1, resume_step=2).close()
    assert [json.loads(x)["step"] for x in (tmp_path / SAMPLES_FILE).read_text().splitlines()] == [1, 2]
    assert (tmp_path / OLD_SAMPLES_FILE).read_text().count("\n") == 1

    trainer = tmp_path / "trainer.jsonl"
    records = [{"kind": "staleness", "step": 2}, {"state": "training", "step": 3, "t0": 0, "t1": 1},
               {"kind": "staleness", "step": 3}]
    trainer.write_text("".join(json.dumps(r) + "\n" for r in records))
    cut_back(trainer, 2)
    assert [json.loads(x) for x in trainer.read_text().splitlines()] == records[:2]
