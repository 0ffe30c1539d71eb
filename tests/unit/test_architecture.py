"""The dependency rules, read from the source: no import cycle inside ``shardworker`` (imports
under ``TYPE_CHECKING`` and inside functions included), no module importing another's private
names, only ``shardworker.store`` importing psycopg (and ``child`` never importing the store),
``outbox`` importing nothing of ``shardworker``, and a docstring on every module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("shardworker", "outbox")


def modules(package: str) -> dict[str, ast.Module]:
    found = {}
    for path in sorted((REPO / package).rglob("*.py")):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        found[name] = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return found


def imports(tree: ast.Module) -> list[tuple[str, list[str]]]:
    """(module, names) of every import statement anywhere in the tree."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, [alias.name for alias in node.names]))
    return out


def internal_graph(package: str) -> dict[str, set[str]]:
    mods = modules(package)
    graph: dict[str, set[str]] = {name: set() for name in mods}
    for name, tree in mods.items():
        for target, names in imports(tree):
            if target in mods and target != name:
                graph[name].add(target)
            for sub in names:  # `from shardworker import wire` imports the module shardworker.wire
                if f"{target}.{sub}" in mods:
                    graph[name].add(f"{target}.{sub}")
        graph[name].discard(package)  # the package __init__ only re-exports
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package: str) -> None:
    """Modules of a package import each other in one direction only."""
    assert find_cycle(internal_graph(package)) is None


def test_find_cycle_finds_one() -> None:
    """The cycle check itself works: a -> b -> a is reported."""
    assert find_cycle({"a": {"b"}, "b": {"a"}, "c": set()}) == ["a", "b", "a"]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_imports_a_private_name_of_another(package: str) -> None:
    """``from x import _name`` across modules is a hidden dependency on internals."""
    offenders = [(name, target, sub) for name, tree in modules(package).items()
                 for target, names in imports(tree) if target.startswith(PACKAGES)
                 for sub in names if sub.startswith("_") and not sub.startswith("__")]
    assert offenders == []


def test_only_the_store_imports_psycopg() -> None:
    """The store seam: only ``shardworker.store`` talks to PostgreSQL."""
    users = sorted(name for name, tree in modules("shardworker").items()
                   if any(target.split(".")[0] == "psycopg" for target, _ in imports(tree)))
    assert users and all(name.startswith("shardworker.store.") for name in users), users


def test_the_child_never_imports_the_store() -> None:
    """A child process holds no database connection: nothing in ``shardworker.child``
    imports ``shardworker.store`` (at the top, under TYPE_CHECKING or in a function)."""
    offenders = [(name, target) for name, tree in modules("shardworker").items() if name.startswith("shardworker.child")
                 for target, names in imports(tree)
                 if target.startswith("shardworker.store") or (target == "shardworker" and "store" in names)]
    assert offenders == []


def test_outbox_imports_nothing_of_shardworker() -> None:
    """The outbox package stands alone."""
    assert [name for name, tree in modules("outbox").items()
            if any(target.split(".")[0] == "shardworker" for target, _ in imports(tree))] == []


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_says_what_it_is(package: str) -> None:
    """Each module opens with a docstring (its role, and what it may touch)."""
    assert [name for name, tree in modules(package).items() if not ast.get_docstring(tree)] == []
