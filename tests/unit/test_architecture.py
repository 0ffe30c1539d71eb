"""The dependency rules, read from the source (imports under ``TYPE_CHECKING`` and inside
functions included): the floors below, with every import running down a floor or staying in
its room; no loop between folders or modules; no module importing another's private names;
only ``shardworker.store`` importing psycopg; and a docstring on every module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("shardworker", "outbox")

# The floors, top down; each holds rooms (a list of modules and packages, and what is under
# them). A module imports from its own room and from the rooms of lower floors: never from a
# floor above, never from another room of its own floor.
FLOORS: list[tuple[str, list[list[str]]]] = [
    ("the commands", [["shardworker.__main__", "shardworker.cli"]]),
    ("what the commands serve", [["shardworker.dashboard"], ["shardworker.demo"], ["shardworker.doctor"],
                                 ["shardworker.testing"]]),
    ("the worker: the parent, which starts the others", [["shardworker.worker"]]),
    ("the processes it starts", [["shardworker.child"], ["shardworker.flusher"]]),
    ("the integrations with other frameworks", [["shardworker.contrib"]]),
    ("the public API", [["shardworker", "shardworker.app", "shardworker.client", "shardworker.jobs",
                         "shardworker.queues", "shardworker.control", "shardworker.events", "shardworker.asgi"]]),
    ("PostgreSQL", [["shardworker.store"], ["shardworker.embedded"]]),
    ("the shared internals", [["shardworker.core"]]),
    ("the exceptions", [["shardworker.errors"]]),
    ("the outbox", [["outbox"]]),
]


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


def import_graph(mods: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Each of ``mods`` and the modules of ``mods`` it imports (``from shardworker.core import
    wire`` imports the module shardworker.core.wire)."""
    graph: dict[str, set[str]] = {name: set() for name in mods}
    for name, tree in mods.items():
        for target, names in imports(tree):
            if target in mods and target != name:
                graph[name].add(target)
            graph[name].update(f"{target}.{sub}" for sub in names if f"{target}.{sub}" in mods)
    return graph


def internal_graph(package: str) -> dict[str, set[str]]:
    graph = import_graph(modules(package))
    for targets in graph.values():
        targets.discard(package)  # the package __init__ only re-exports
    return graph


def room_of(module: str) -> tuple[int, int]:
    """(floor, room) of a module: the room naming it or its closest package."""
    best: tuple[int, int, int] | None = None
    for floor, (_, rooms) in enumerate(FLOORS):
        for room, names in enumerate(rooms):
            for name in names:
                if (module == name or module.startswith(f"{name}.")) and (best is None or len(name) > best[2]):
                    best = (floor, room, len(name))
    assert best is not None, f"{module} stands on no floor: add it to FLOORS"
    return best[0], best[1]


def floor_offences(graph: dict[str, set[str]]) -> list[str]:
    offences = []
    for module, targets in sorted(graph.items()):
        (floor, room) = room_of(module)
        for target in sorted(targets):
            (to_floor, to_room) = room_of(target)
            if to_floor < floor:
                offences.append(f"{module} imports {target}: up, to {FLOORS[to_floor][0]}")
            elif to_floor == floor and to_room != room:
                offences.append(f"{module} imports {target}: sideways, within {FLOORS[floor][0]}")
    return offences


def whole_graph() -> dict[str, set[str]]:
    """Every module of both packages and the modules it imports from either."""
    return import_graph({name: tree for package in PACKAGES for name, tree in modules(package).items()})


def folder_of(module: str, packages: set[str]) -> str:
    """The package a module belongs to (a package's ``__init__`` belongs to its parent)."""
    parent = module.rpartition(".")[0]
    return parent if parent in packages else module


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


def test_every_module_stands_on_a_floor() -> None:
    for module in whole_graph():
        room_of(module)


def test_every_import_runs_down_a_floor_or_stays_in_its_room() -> None:
    """The public API and the commands on top; the worker above the child and the flusher it
    starts, which never import each other; then the store, the shared internals, the
    exceptions and the outbox (``FLOORS``)."""
    assert floor_offences(whole_graph()) == []


def test_the_floor_check_sees_an_upward_and_a_sideways_import() -> None:
    graph = {"shardworker.store.x": {"shardworker.worker.y"}, "shardworker.child.a": {"shardworker.flusher.b"},
             "shardworker.worker.y": {"shardworker.core.z"}, "shardworker.core.z": set(),
             "shardworker.worker.recovery": {"shardworker.worker.giveback"}}
    assert floor_offences(graph) == [
        "shardworker.child.a imports shardworker.flusher.b: sideways, within the processes it starts",
        "shardworker.store.x imports shardworker.worker.y: up, to the worker: the parent, which starts the others"]


def test_no_loop_between_folders() -> None:
    """The module-cycle check misses a loop between packages (``a/x`` imports ``b/y``, which
    imports ``a/z``): packages import each other in one direction too."""
    graph = whole_graph()
    packages = {name for name in graph if (REPO / Path(*name.split("."))).is_dir()}
    folders: dict[str, set[str]] = {}
    for module, targets in graph.items():
        here = folder_of(module, packages)
        folders.setdefault(here, set()).update(t for t in (folder_of(t, packages) for t in targets) if t != here)
    for deps in folders.values():
        deps.discard("shardworker")  # the top package's __init__ only re-exports
    folders = {name: deps & set(folders) for name, deps in folders.items()}
    assert find_cycle(folders) is None


def test_the_outbox_is_used_through_its_face() -> None:
    """``shardworker`` imports ``outbox`` (its ``__init__``), never a module inside it: what
    other floors need of the outbox is its public API."""
    offenders = [(name, target) for name, tree in modules("shardworker").items()
                 for target, _ in imports(tree) if target.startswith("outbox.")]
    assert offenders == []
