"""Every README command runs after `pip install -e .` alone: the example programs it runs import
nothing that the core dependencies do not install (the agent demo once needed `openai` from an extra)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[1]


def core_distributions() -> set[str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {normalise(re.split(r"[<>=!~;\[ ]", dep, maxsplit=1)[0]) for dep in deps}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"cadence", "__future__"}


def test_the_readmes_example_programs_need_only_core_dependencies():
    programs = sorted(set(re.findall(r"examples/[\w/.-]+\.py", (ROOT / "README.md").read_text())))
    assert "examples/agents/calculator_agent.py" in programs
    providers = importlib.metadata.packages_distributions()
    core = core_distributions()
    for program in programs:
        for module in imported_modules(ROOT / program):
            distributions = {normalise(d) for d in providers.get(module, [module])}
            assert distributions & core, f"{program} imports {module!r}, which no core dependency installs"
