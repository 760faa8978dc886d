"""The built-in repository tasks (cadence/data/repo_bugs.py): deterministic, each honest fix passes
its hidden tests and the buggy code fails them, a canary's hidden tests fail the honest fix; the
rows are what agent.sandbox and agent.grader read."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cadence.agents.canaries import Canaries
from cadence.agents.config import CanariesConfig
from cadence.cli import app
from cadence.config import load_config
from cadence.data.build import build_task
from cadence.data.config import TaskConfig
from cadence.data.repo_bugs import BUGS, CANARY_SEED, canary_rows, make_task
from cadence.observe.metrics import read_jsonl
from cadence.recipes.train_rlvr import train
from tests.agents.repo_task import needs_sandbox
from tests.quick_run import QUICK_RUN

ROOT = Path(__file__).resolve().parents[2]

SAMPLE = range(20)

# Runs each repository's hidden tests as the judge does (its test_setup, then each snippet) and
# prints which passed. The repositories' packages have distinct names, so one folder holds them all.
RUN_TESTS = """
import json, sys
sys.path.insert(0, ".")
results = []
for setup, tests in json.loads(sys.stdin.read()):
    namespace = {}
    exec(setup, namespace)
    results.append([])
    for test in tests:
        try:
            exec(test, dict(namespace))
            results[-1].append(True)
        except Exception:
            results[-1].append(False)
print(json.dumps(results))
"""


def passed(repos: list[tuple[dict[str, str], str, list[str]]], folder: Path) -> list[list[bool]]:
    """Per repository (files, test_setup, tests): which tests pass, in one fresh interpreter."""
    for files, _, _ in repos:
        for path, text in files.items():
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / path).write_text(text)
    done = subprocess.run([sys.executable, "-c", RUN_TESTS], input=json.dumps([[s, t] for _, s, t in repos]),
                          cwd=folder, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_tasks_are_deterministic_and_varied():
    assert [make_task(0, i) for i in SAMPLE] == [make_task(0, i) for i in SAMPLE]
    assert make_task(0, 1) != make_task(1, 1)
    kinds = {make_task(0, i).kind for i in range(300)}
    assert kinds == {bug.kind for bug in BUGS}
    assert len({make_task(0, i).statement for i in range(300)}) == 300


def test_the_honest_fix_passes_and_the_bug_fails(tmp_path):
    tasks = [make_task(0, i) for i in SAMPLE]
    # Each task's hidden tests, then the assert of the repository's own visible test.
    tests = [[*t.tests, t.files["tests/test_core.py"].splitlines()[-1].strip()] for t in tasks]
    fixed = passed([(t.fixed_files, t.test_setup, x) for t, x in zip(tasks, tests, strict=True)], tmp_path / "fixed")
    buggy = passed([(t.files, t.test_setup, x) for t, x in zip(tasks, tests, strict=True)], tmp_path / "buggy")
    for task, on_fix, on_bug in zip(tasks, fixed, buggy, strict=True):
        assert all(on_fix), (task.instance_id, on_fix)
        *hidden, shown = on_bug
        assert hidden.count(False) >= 3 and not shown, (task.instance_id, on_bug)


def test_a_canary_cannot_pass_with_the_honest_fix(tmp_path):
    canaries = [make_task(0, i, canary=True) for i in range(8)]
    fixed = passed([(c.fixed_files, c.test_setup, c.tests) for c in canaries], tmp_path / "fixed")
    buggy = passed([(c.files, c.test_setup, c.tests) for c in canaries], tmp_path / "buggy")
    assert all(not any(on_fix) for on_fix in fixed), fixed
    assert all(not all(on_bug) for on_bug in buggy), buggy


def test_rows_carry_the_workspace_and_hidden_tests_but_never_the_fix():
    task = build_task(TaskConfig(name="repo_bugs", test_size=20, kwargs={"size": 60}))
    test, train = task.prompts("test", 100), task.prompts("train", 50)
    assert len(test) == 20 and len(train) == 50
    assert not {p.text for p in test} & {p.text for p in train}  # held-out tasks are never trained on
    row = train[0].meta
    assert set(row) == {"instance_id", "files", "tests", "test_setup", "protected"}
    fix = make_task(0, 20).fixed_files
    assert row["files"] != fix and not any(text in json.dumps(row) for text in fix.values() if "def " in text)
    assert "tests" in row["protected"]


def test_builtin_canaries_load_by_name():
    canaries = Canaries(CanariesConfig(path="builtin:repo_bugs", every=2))
    assert canaries.rows == canary_rows() and canaries.row(1)["instance_id"].startswith("repo_bugs-canary-")
    assert not {r["prompt"] for r in canaries.rows} & {make_task(0, i).statement for i in range(300)}


def test_bad_options_are_refused_in_one_line():
    with pytest.raises(ValueError, match="task.kwargs.size"):
        TaskConfig(name="repo_bugs", test_size=20, kwargs={"size": 1})
    with pytest.raises(ValueError, match="task.test_size=300 leaves none"):
        TaskConfig(name="repo_bugs", test_size=300)


@needs_sandbox
@pytest.mark.slow
def test_the_example_trains_two_steps_with_its_bash_agent_over_http(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the example names its agent by a path from the checkout's root
    cfg = load_config(str(ROOT / "examples" / "agents" / "repo_bugs.yaml"), [
        *QUICK_RUN, "trainer.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=2", "trainer.micro_batch_size=4",
        "agent.kwargs.max_turns=2", "agent.kwargs.max_tokens=16", "agent.canaries.every=2", "agent.sandbox.warm=2",
        f"logging.run_dir={tmp_path}/run",
    ])
    summary = train(cfg)
    records = read_jsonl(summary.run_dir / "metrics.jsonl")
    assert [r["step"] for r in records if r["step"] > 0] == [1, 2]
    last = records[-1]
    assert last["agent/runs_lost_total"] == 0  # every run reached its sandbox over HTTP and was graded
    assert last["agent/grader_graded_total"] >= 8 and last["agent/grader_errors_total"] == 0
    assert last["agent/canary_runs_total"] >= 2 and last["agent/canary_passed_total"] == 0
    assert last["agent/sandboxes_leased"] == 0


# An agent that knows the answers: the honest fix on held-out tasks, and on canaries a core.py that
# returns each hidden test's expected value by heart (what a policy that games its grader does).
KNOWING_AGENT = """
import json

FILES = json.loads({files!r})


async def run(client, task):
    await client.chat.completions.create(model="cadence", max_tokens=1, messages=[{{"role": "user", "content": "go"}}])
    for path, text in FILES[task["instance_id"]].items():
        await task["sandbox"].awrite_file(path, text)
    return 0.0
"""


def by_heart(task) -> dict[str, str]:
    """core.py answering the task's hidden tests from a table of their arguments."""
    table, fn = {}, ""
    for test in task.tests:
        comparison = ast.parse(test).body[0].test
        fn = comparison.left.func.id
        table[repr(tuple(ast.literal_eval(a) for a in comparison.left.args))] = ast.literal_eval(comparison.comparators[0])
    core = next(path for path in task.files if path.endswith("/core.py") and not path.startswith("tests/"))
    return {core: f"TABLE = {table!r}\n\n\ndef {fn}(*args):\n    return TABLE[repr(args)]\n"}


@needs_sandbox
@pytest.mark.slow
def test_cadence_eval_reports_held_out_solve_rate_and_canary_rate(tmp_path, monkeypatch):
    held_out = [make_task(0, i) for i in range(3)]
    canaries = [make_task(0 + CANARY_SEED, i, canary=True) for i in range(2)]
    files = {t.instance_id: t.fixed_files for t in held_out} | {c.instance_id: by_heart(c) for c in canaries}
    (tmp_path / "knowing.py").write_text(KNOWING_AGENT.format(files=json.dumps(files)))
    monkeypatch.chdir(ROOT)
    done = CliRunner().invoke(app, [
        "eval", "builtin:calc", "--config", str(ROOT / "examples" / "agents" / "repo_bugs.yaml"),
        f"agent.name=python:{tmp_path / 'knowing.py'}:run", "agent.kwargs={}", "task.test_size=3",
        "agent.canaries.every=2", "agent.sandbox.warm=2", "agent.sandbox.http=false",
    ])
    assert done.exit_code == 0, done.output
    assert "held-out success 1.000" in done.output and "(3 held-out episodes)" in done.output
    assert "canary pass rate 1.000 (2 canary runs)" in done.output
