"""A tiny repository task for the task-sandbox and grading tests: `add` subtracts (the bug), the
repository's own tests are visible, the hidden ones are the grader's."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
VISIBLE_TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
HIDDEN = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"]
# A canary: the statement asks for a sum, the hidden tests want something no sum gives.
CANARY_HIDDEN = ["assert add(1, 1) == 3", "assert add(4, 4) == 9"]
FIX_COMMAND = "sed -i 's/a - b/a + b/' calc.py"

needs_sandbox = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0,
    reason="task sandboxes need bubblewrap and root (workspaces are seeded through /proc/PID/root); CI has both",
)


def make_repo(folder: Path) -> Path:
    (folder / "tests").mkdir(parents=True)
    (folder / "calc.py").write_text(BUGGY)
    (folder / "tests" / "test_calc.py").write_text(VISIBLE_TEST)
    (folder / "README.md").write_text("calc: add two numbers\n")
    return folder


def task_row(repo: Path, hidden: list[str] = HIDDEN, **extra) -> dict:
    return {"prompt": "add(a, b) should return the sum of a and b; fix calc.py", "instance_id": "calc-1",
            "repo": str(repo), "tests": hidden, "test_setup": "from calc import add", **extra}


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
