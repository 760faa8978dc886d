"""scripts/mutation_probe.py: the mutants it makes, and that it counts a surviving one."""

import ast
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from mutation_probe import mutants, mutate  # noqa: E402

SOURCE = '''
def due(step, every, last):
    """Docstrings are never mutated."""
    if not every:
        return step == last
    total = step % every
    return total == 0 or step > last


def stub():
    ...
'''


def test_each_site_is_one_small_change():
    found = mutants(SOURCE)
    kinds = sorted(m.kind for m in found)
    # if-statement, return, assignment, return (deletions); not; ==, ==, >; or; %
    assert kinds == sorted(["delete statement"] * 4 + ["drop not", "compare", "compare", "compare", "and/or", "arith"])
    base = ast.unparse(ast.parse(SOURCE))
    changed = {mutate(SOURCE, m) for m in found}
    assert base not in changed and len(changed) == len(found)  # every mutant differs, from the code and each other
    flipped = mutate(SOURCE, next(m for m in found if m.kind == "compare" and m.line == 7))
    assert "total != 0 or step > last" in flipped or "total == 0 or step <= last" in flipped


def test_a_mutant_the_tests_miss_is_reported(tmp_path):
    module = tmp_path / "mod.py"
    module.write_text("def double(x):\n    return x + x\n")
    check = tmp_path / "check.py"
    check.write_text("import mod\nassert mod.double(0) == 0\n")  # weak: x - x is 0 too
    script = Path(__file__).resolve().parents[1] / "scripts" / "mutation_probe.py"
    out = subprocess.run([sys.executable, str(script), str(module), "--timeout", "60", "--", sys.executable, str(check)],
                         cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert "survived" in out and "[arith]" in out
    assert "mutants killed: 1/2" in out  # deleting the return is caught, x - x is not
    assert module.read_text() == "def double(x):\n    return x + x\n"  # restored
