"""Every module the repository's prose points to exists: no dangling ``ftd/...py`` path or ``ftd.x.y`` name.

Modules move (the coordinator was reorganised by stage, the rule contract lives in ``ftd/plugin``),
and the sentences that point at them do not move with them: a plugin author who opens
``ftd/coordinator/hookspecs.py`` because the template says so finds nothing. This test reads the
prose -- every ``*.md`` and ``*.toml`` file, everything under ``deploy/`` and ``systemd/``, and the
docstrings of every Python file -- and checks each reference against the source tree:

* a path ``ftd/a/b.py`` (or ``ftd/a/b/``) must exist;
* a dotted name ``ftd.a.b`` must be a module or package, or a name a module defines at top level
  (``ftd.coordinator.decide.plugins.make_plugin_manager``), or an attribute of such a class
  (``ftd.coordinator.ledger.postgres.PgLedger.epoch`` is accepted once ``PgLedger`` exists).

It is static (nothing is imported), so it also covers modules that need torch or a database.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SELF = Path(__file__).resolve()  # its own docstrings name made-up modules on purpose
SKIP_DIRS = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "node_modules"}

# ``ftd/...py`` or a package folder ``ftd/.../``; not inside a longer path (``/usr/lib/ftd/x.py``) nor a
# topic (``ftd/v1/...``).
PATH = re.compile(r"(?<![\w/.-])ftd/(?!v1/)((?:\w+/)*\w+\.py|(?:\w+/)+)(?![\w*{<])")
# ``ftd.a.b``: a dotted name, not a file name such as ``ftd.toml`` nor a domain (``ftd.dev/role``).
DOTTED = re.compile(r"(?<![\w./-])ftd((?:\.[A-Za-z_]\w*)+)(?![\w/])")
NOT_MODULES = {
    "toml",
    "service",
    "socket",
    "sock",
    "sqlite",
    "json",
    "jsonl",
    "log",
    "yaml",
    "yml",
    "conf",
    "db",
    "pem",
    "py",
    "md",
    "txt",
    "png",
    "html",
    "target",
    "timer",
    "default",
    "example",
}


def prose_files() -> Iterator[Path]:
    found: list[Path] = []
    for root, dirs, files in os.walk(REPO):  # not REPO.rglob: it would list all of .venv and .git
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        found.extend(Path(root, name) for name in files)
    for path in sorted(found):
        if not path.is_file() or SKIP_DIRS & set(path.relative_to(REPO).parts) or path == SELF:
            continue
        rel = path.relative_to(REPO)
        if path.suffix in (".md", ".toml", ".py") or rel.parts[0] in ("deploy", "systemd"):
            yield path


def prose_of(path: Path) -> str:
    """The text to check: a Python file's docstrings, any other file whole."""
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return ""
    if path.suffix != ".py":
        return text
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return ""
    docs = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                docs.append(doc)
    return "\n".join(docs)


@cache
def top_level_names(module: Path) -> frozenset[str]:
    """What a module defines or imports at top level (and, for classes, ``Class.attr`` pairs)."""
    tree = ast.parse(module.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return frozenset(names)


def module_file(parts: list[str]) -> Path | None:
    base = REPO.joinpath("ftd", *parts)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if base.is_dir():  # a data folder (ftd/sim/data) or a namespace package
        return base
    return None


def dotted_exists(dotted: str) -> bool:
    parts = dotted.split(".")[1:]
    for cut in range(len(parts), 0, -1):
        found = module_file(parts[:cut])
        if found is None:
            continue
        rest = parts[cut:]
        if not rest:
            return True
        return found.is_file() and rest[0] in top_level_names(found)
    return not parts  # "ftd" itself


def dangling() -> list[str]:
    problems: list[str] = []
    for path in prose_files():
        text = prose_of(path)
        rel = path.relative_to(REPO)
        for match in PATH.finditer(text):
            target = REPO / "ftd" / match[1]
            if not target.exists():
                problems.append(f"{rel}: ftd/{match[1]} does not exist")
        for match in DOTTED.finditer(text):
            dotted = "ftd" + match[1]
            if match[1].split(".")[1] in NOT_MODULES:
                continue
            if not dotted_exists(dotted):
                problems.append(f"{rel}: {dotted} does not exist")
    return sorted(set(problems))


def test_every_module_the_prose_names_exists() -> None:
    problems = dangling()
    assert not problems, "dangling references (moved or removed modules):\n" + "\n".join(problems)


def test_the_check_catches_a_moved_module(tmp_path: Path) -> None:
    """The checker itself: the old home of the hookspecs is reported, the new one is not."""
    assert not dotted_exists("ftd.coordinator.hookspecs")
    assert dotted_exists("ftd.plugin.hookspecs")
    assert dotted_exists("ftd.plugin.hookspecs.hookimpl")
    assert not dotted_exists("ftd.plugin.hookspecs.no_such_name")
    assert PATH.search("see ftd/coordinator/hookspecs.py.")[1] == "coordinator/hookspecs.py"  # type: ignore[index]
    assert PATH.search("topic ftd/v1/nodes/x/status") is None
    assert PATH.search("ftd/agent/watchers/*.py") is None
