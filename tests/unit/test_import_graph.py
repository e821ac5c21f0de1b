"""The import graph of ``ftd``: no cycles between modules, and the floors of pyproject.toml hold.

What: three checks on the source, so that ``make test`` enforces what ``make check`` lints:

- the import-linter contracts declared in ``pyproject.toml`` (``[tool.importlinter]``: the floors,
  the daemons' independence, the stdlib-only trainer client, the pure rules) are kept, checked by
  running ``lint-imports`` itself;
- every top-level module of ``ftd/`` has a place on a floor of the ``floors`` contract (a module
  left out of the layers would be free to import anything);
- no two modules of ``ftd`` import each other, directly or round a loop: the graph of every import
  statement (lazy ones inside functions and ``TYPE_CHECKING`` blocks included) has no strongly
  connected component of more than one module.

Why: a cycle makes import order matter and hides which side owns a concept; an upward import ties a
lower floor (the config, the bus, the plugin contract) to a daemon that should be free to change.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "ftd"


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of ftd (a package by its ``__init__.py``)."""
    found: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imported(module: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """The ftd modules ``module`` imports, each resolved to the longest name that is a module."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            # ``from pkg import sub`` imports the submodule when there is one, else a name of pkg
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
            ]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                yield name


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Module -> the ftd modules it imports (parsed once per test session)."""
    modules = _modules()
    return {module: set(_imported(module, path, modules)) for module, path in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components of more than one module (the import cycles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return cycles


def test_the_cycle_finder_finds_a_loop_and_only_the_loop() -> None:
    graph: dict[str, set[str]] = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_relative_lazy_and_submodule_imports() -> None:
    graph = import_graph()
    assert "ftd.catalog.log_patterns" in graph["ftd.agent.watchers.logfile"]  # absolute, module level
    assert "ftd.agent.preflight.runner" in graph["ftd.agent.hooks"]  # lazy, inside a method
    assert "ftd.events" in graph["ftd.catalog.log_patterns"]


def test_no_import_cycle_among_ftd_modules() -> None:
    cycles = strongly_connected(import_graph())
    assert not cycles, (
        "import cycles (each line: modules that import each other round a loop):\n"
        + "\n".join(" <-> ".join(cycle) for cycle in cycles)
    )


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    contracts: list[dict[str, object]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def _children(package: str) -> set[str]:
    """The modules and packages directly inside ``package`` (dotted, under ``ftd/``)."""
    folder = REPO.joinpath(*package.split("."))
    return {
        path.stem if path.is_file() else path.name
        for path in folder.iterdir()
        if (path.is_file() and path.suffix == ".py" and path.stem != "__init__")
        or (path.is_dir() and (path / "__init__.py").exists())
    }


def test_every_top_level_module_has_a_floor() -> None:
    (floors,) = [c for c in _contracts() if c.get("id") == "floors"]
    layers = floors["layers"]
    assert isinstance(layers, list)
    placed = {
        name.strip().strip("()")
        for layer in layers
        for sibling in layer.replace(":", "|").split("|")
        if (name := sibling.strip())
    }
    top_level = {f"ftd.{name}" for name in _children("ftd")}
    assert top_level - placed == set(), "place these modules on a floor in pyproject.toml [tool.importlinter]"
    assert placed - top_level == set(), "the floors name modules that do not exist"


def test_import_contracts_are_kept() -> None:
    """``lint-imports`` on the repository (what ``make check`` runs), its report shown on failure."""
    code = (
        "import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(no_cache=True, no_logo=True))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_every_stage_contract_is_exhaustive_and_places_every_module() -> None:
    """The coordinator's and the agent's stage contracts are ``exhaustive`` (``lint-imports`` fails on a
    module left out), and every child of their container is placed now."""
    staged = [c for c in _contracts() if c.get("type") == "layers" and c.get("containers")]
    assert {c["id"] for c in staged} >= {"coordinator-stages", "agent-stages"}
    for contract in staged:
        assert contract.get("exhaustive") is True, f"{contract['id']}: set exhaustive = true"
        layers = contract["layers"]
        containers = contract["containers"]
        assert isinstance(layers, list) and isinstance(containers, list)
        placed = {name.strip() for layer in layers for name in layer.split("|")}
        for container in containers:
            assert _children(container) == placed, f"{contract['id']}: {container}'s modules vs its layers"
