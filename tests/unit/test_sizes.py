"""An alarm, not a shape: sizes follow cohesion (a module is as long as its one role needs),
and these limits sit far above what that gives (modules of 100-300 lines, functions of 8-30),
so they only catch a file or a function that has grown several roles, in the product, the
outbox, the benchmarks and the tests. Never split a file or pack lines to fit them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("shardworker", "outbox", "bench", "tests")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def sources() -> list[Path]:
    return sorted(p for root in ROOTS for p in (REPO / root).rglob("*.py"))


def long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


def test_there_is_something_to_check() -> None:
    assert len(sources()) > 100


@pytest.mark.parametrize("root", ROOTS)
def test_no_module_has_grown_several_roles(root: str) -> None:
    over = {str(p.relative_to(REPO)): n for p in sources() if p.relative_to(REPO).parts[0] == root
            and (n := p.read_text(encoding="utf-8").count("\n")) > MAX_MODULE_LINES}
    assert over == {}


@pytest.mark.parametrize("root", ROOTS)
def test_no_function_has_grown_several_steps(root: str) -> None:
    over = {str(p.relative_to(REPO)): found for p in sources() if p.relative_to(REPO).parts[0] == root
            and (found := long_functions(p))}
    assert over == {}


def test_the_rules_see_a_long_function(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n" + "    x = 1\n" * 90)
    assert long_functions(sample) == ["f (91 lines)"]
