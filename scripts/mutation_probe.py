"""Mutation probe over the syntax tree: how many small breakages of a file do its tests catch?

    python scripts/mutation_probe.py cadence/train/checkpointer.py -- python -m pytest -x -q tests/test_run_state.py

Each mutant changes one thing in the file, writes it, runs the test command, and restores the
file: a comparison flipped (== and !=, < and >=, in and not in, is and is not), `and`/`or`
swapped, a `not` dropped, a boolean constant flipped, an arithmetic operator changed, or one
statement of a function body replaced by `pass` (a save that never happens, a field never
restored). A mutant is killed when the command fails or hangs past --timeout. Unlike a line-based
flipper it sees operators on lines that also hold strings, and statements with no operator at all,
which is most of what a state or checkpoint module is made of.

The mutated file is written with `ast.unparse` (comments and layout go; the code is the same).
"""

from __future__ import annotations

import argparse
import ast
import copy
import random
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

COMPARE_FLIPS: dict[type, type] = {
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt,
    ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}
BINOP_FLIPS: dict[type, type] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.Mod: ast.Mult,
    ast.FloorDiv: ast.Mult,
}


@dataclass(frozen=True)
class Mutant:
    index: int  # the node's position in a walk of the tree (stable for one source)
    kind: str
    line: int


def _function_statements(tree: ast.AST) -> Iterator[ast.stmt]:
    """Every statement inside a function (nested blocks too), its docstring apart."""
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = fn.body[0] if ast.get_docstring(fn) else None
            for node in ast.walk(fn):
                if isinstance(node, ast.stmt) and node is not fn and node is not docstring:
                    yield node


def _sites(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    statements = {id(s) for s in _function_statements(tree)}
    out: list[tuple[ast.AST, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and type(node.ops[0]) in COMPARE_FLIPS:
            out.append((node, "compare"))
        elif isinstance(node, ast.BoolOp):
            out.append((node, "and/or"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            out.append((node, "drop not"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            out.append((node, "bool"))
        elif isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in BINOP_FLIPS:
            out.append((node, "arith"))
        stub = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and node.value.value is Ellipsis
        if id(node) in statements and not isinstance(node, ast.Pass) and not stub:
            out.append((node, "delete statement"))
    return out


class _Apply(ast.NodeTransformer):
    def __init__(self, target: int, kind: str) -> None:
        self.target, self.kind, self.seen = target, kind, -1

    def visit(self, node: ast.AST) -> ast.AST:
        self.seen += 1
        if self.seen != self.target:
            return self.generic_visit(node)
        if self.kind == "delete statement":
            return ast.copy_location(ast.Pass(), node)
        if self.kind == "compare":
            node.ops[0] = COMPARE_FLIPS[type(node.ops[0])]()
        elif self.kind == "and/or":
            node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        elif self.kind == "drop not":
            return node.operand
        elif self.kind == "bool":
            node.value = not node.value
        elif self.kind == "arith":
            node.op = BINOP_FLIPS[type(node.op)]()
        return node


def _walk_index(tree: ast.AST) -> dict[int, int]:
    """Node id -> its position in the order NodeTransformer visits (pre-order, fields in order)."""
    order: dict[int, int] = {}
    count = 0

    def visit(node: ast.AST) -> None:
        nonlocal count
        # Contexts and operators (Load, Add) are shared objects: count every visit, keep the first.
        order.setdefault(id(node), count)
        count += 1
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return order


def mutants(source: str) -> list[Mutant]:
    tree = ast.parse(source)
    order = _walk_index(tree)
    return [Mutant(order[id(n)], kind, getattr(n, "lineno", 0)) for n, kind in _sites(tree)]


def mutate(source: str, mutant: Mutant) -> str:
    tree = copy.deepcopy(ast.parse(source))
    return ast.unparse(ast.fix_missing_locations(_Apply(mutant.index, mutant.kind).visit(tree)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file")
    parser.add_argument("--max", type=int, default=0, help="at most this many mutants, drawn at random (0: all)")
    parser.add_argument("--timeout", type=float, default=300.0)
    argv = sys.argv[1:]
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        parser.error("give the test command after --")
    split = argv.index("--")
    args, cmd = parser.parse_args(argv[:split]), argv[split + 1 :]
    path = Path(args.file)
    original = path.read_text()
    todo = mutants(original)
    if args.max:
        todo = random.Random(0).sample(todo, min(args.max, len(todo)))
    killed, survivors = 0, []
    try:
        for m in todo:
            path.write_text(mutate(original, m))
            try:
                dead = subprocess.run(cmd, capture_output=True, timeout=args.timeout).returncode != 0
            except subprocess.TimeoutExpired:
                dead = True  # a hang is caught too: CI would time out
            killed += dead
            if not dead:
                line = original.splitlines()[m.line - 1].strip() if m.line else ""
                survivors.append(f"{args.file}:{m.line}: [{m.kind}] {line}")
    finally:
        path.write_text(original)
    print("\n".join("  survived " + s for s in survivors))
    total = len(todo)
    print(f"mutants killed: {killed}/{total} ({100 * killed / max(total, 1):.0f}%) in {args.file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
