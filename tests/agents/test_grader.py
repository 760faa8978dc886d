"""What a run's changes are (what the grader carries to a fresh copy of the task), scoring, and
the grader's settings: no sandbox needed."""

from __future__ import annotations

import io
import tarfile

import pytest

from cadence.agents.config import AgentConfig, GraderConfig
from cadence.agents.grader import Grader, matches, workspace_changes

PROTECTED = GraderConfig().protected


def tar_of(files: dict[str, bytes | str], links: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            raw = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buf.getvalue()


START = tar_of({"calc.py": "buggy", "tests/test_calc.py": "visible", "README.md": "r"})


def test_changes_carry_written_and_deleted_files_but_not_protected_ones():
    after = tar_of({"calc.py": "fixed", "tests/test_calc.py": "def test(): pass", "new.py": "x",
                    "conftest.py": "hook", "pkg/conftest.py": "hook", "pkg/tests/x.py": "t", "a.pth": "import os",
                    "sitecustomize.py": "s", "pytest.ini": "[pytest]"})
    changes = workspace_changes(START, after, PROTECTED)
    assert changes.written == {"calc.py": b"fixed", "new.py": b"x"}
    assert changes.deleted == ["README.md"]
    assert set(changes.dropped) == {"tests/test_calc.py", "conftest.py", "pkg/conftest.py", "pkg/tests/x.py",
                                    "a.pth", "sitecustomize.py", "pytest.ini"}


def test_deleting_protected_files_is_not_carried():
    changes = workspace_changes(START, tar_of({"calc.py": "buggy", "README.md": "r"}), PROTECTED)
    assert changes.deleted == [] and changes.written == {} and changes.dropped == {"tests/test_calc.py": "protected"}


def test_symbolic_links_are_not_carried_and_a_file_made_a_link_is_deleted():
    after = tar_of({"tests/test_calc.py": "visible", "README.md": "r"},
                   links={"calc.py": "/tmp/fixed_calc.py", "escape": "../../etc/passwd"})
    changes = workspace_changes(START, after, PROTECTED)
    assert changes.written == {} and changes.deleted == ["calc.py"]
    assert changes.dropped == {"calc.py": "a symbolic link", "escape": "a symbolic link"}


def test_outputs_carry_only_the_named_paths():
    after = tar_of({"calc.py": "fixed", "tests/test_calc.py": "visible", "README.md": "changed", "out/a.txt": "a"})
    changes = workspace_changes(START, after, PROTECTED, outputs=["calc.py", "out/*"])
    assert changes.written == {"calc.py": b"fixed", "out/a.txt": b"a"}
    assert changes.dropped == {"README.md": "not an output"}


@pytest.mark.parametrize(("path", "hit"), [("tests/a.py", True), ("src/tests/a.py", True), ("src/a.py", False),
                                           ("conftest.py", True), ("x/y/conftest.py", True), ("lib/z.pth", True),
                                           ("testsuite.py", False), ("src/pkg/data.json", True)])
def test_protected_paths_match_as_gitignore_does(path, hit):
    assert matches(path, [*PROTECTED, "src/pkg"]) is hit


def test_scoring_fraction_all_and_a_user_function(tmp_path):
    report = {"passed": 2, "total": 3, "error": None}
    assert Grader(GraderConfig()).score(report) == pytest.approx(2 / 3)
    assert Grader(GraderConfig(scoring="all")).score(report) == 0.0
    assert Grader(GraderConfig(scoring="all")).score({**report, "passed": 3}) == 1.0
    assert Grader(GraderConfig()).score({**report, "error": "judge killed"}) == 0.0
    mod = tmp_path / "scores.py"
    mod.write_text("def score(report):\n    return 10.0 * report['passed'] if report['error'] is None else -1.0\n")
    grader = Grader(GraderConfig(scoring=f"python:{mod}:score"))
    assert grader.score(report) == 20.0 and grader.score({**report, "error": "x"}) == -1.0


def test_grading_settings_are_checked_when_the_config_loads(tmp_path):
    agent = tmp_path / "agent.py"
    agent.write_text("async def run(client, task):\n    return 0.0\n")
    name = f"python:{agent}:run"
    with pytest.raises(ValueError, match="agent.grader grades the run's sandbox: set agent.sandbox"):
        AgentConfig(name=name, grader={})
    with pytest.raises(ValueError, match="agent.canaries are scored by the grader"):
        AgentConfig(name=name, sandbox={}, canaries={"path": str(agent)})
    with pytest.raises(ValueError, match="agent.sandbox and agent.grader need agent.tasks=task"):
        AgentConfig(name=name, sandbox={}, tasks="seeds")
    with pytest.raises(ValueError, match="agent.canaries.path 'nope.jsonl': no such file"):
        AgentConfig(name=name, sandbox={}, grader={}, canaries={"path": "nope.jsonl"})
    with pytest.raises(ValueError, match="agent.grader.scoring 'best'"):
        AgentConfig(name=name, sandbox={}, grader={"scoring": "best"})
