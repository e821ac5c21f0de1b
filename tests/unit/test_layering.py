"""Layering rules (docs/architecture.md §3), checked on the source: who may import what."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "ftd"


@functools.cache  # every test reads the same files: parse each once per process
def imports_of(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return frozenset(names)


def importers_of(top_level: str) -> list[str]:
    return sorted(
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if any(name == top_level or name.startswith(top_level + ".") for name in imports_of(path))
    )


@pytest.mark.parametrize(
    ("library", "allowed"),
    # ftd's MQTT client is paho's public API, in the MQTT seam only; aiomqtt is not imported at all.
    [
        ("aiomqtt", []),
        ("paho", ["ftd/bus/mqtt.py"]),
        ("pynvml", ["ftd/agent/watchers/nvml/real.py"]),
    ],
)
def test_only_the_seam_module_imports_the_library(library: str, allowed: list[str]) -> None:
    assert set(importers_of(library)) <= set(allowed)


def test_rules_do_no_io() -> None:
    forbidden = {
        "asyncio",
        "subprocess",
        "socket",
        "sqlite3",
        "aiohttp",
        "os",
        "ftd.bus",
        "ftd.coordinator.ledger.sqlite",
    }
    for path in (PACKAGE / "rules").glob("*.py"):
        bad = {n for n in imports_of(path) if n in forbidden or any(n.startswith(f + ".") for f in forbidden)}
        assert not bad, f"{path.name} imports {sorted(bad)}: rules are pure, I/O belongs to executors"


# The framework adapters may import the framework they adapt, and nothing else outside the stdlib.
_CLIENT_FRAMEWORKS = {
    "torch.py": {"torch"},
    "lightning.py": {"lightning", "pytorch_lightning", "torch"},
    "hf.py": {"transformers", "torch"},
    "checkpoint.py": {"torch"},  # the checkpoint tier (issue #34)
    "resume.py": {"torch"},
}


def test_client_package_imports_only_the_standard_library_and_itself() -> None:
    """Static check over every file of ``ftd/client`` (lazy imports inside functions included)."""
    for path in sorted((PACKAGE / "client").rglob("*.py")):
        allowed = _CLIENT_FRAMEWORKS.get(path.name, set())
        bad = sorted(
            name
            for name in imports_of(path)
            if not (name == "ftd.client" or name.startswith("ftd.client."))
            and (root := name.split(".")[0]) not in sys.stdlib_module_names
            and root not in allowed
        )
        assert not bad, f"{path.relative_to(PACKAGE.parent)} imports {bad}: the trainer client is stdlib only"


def test_rank_supervisor_imports_only_the_standard_library_and_the_client() -> None:
    """``ftd.supervisor`` (ftd run) ships in the trainer-only wheel: stdlib, itself and ftd.client."""
    for path in sorted((PACKAGE / "supervisor").rglob("*.py")):
        bad = sorted(
            name
            for name in imports_of(path)
            if not any(name == p or name.startswith(p + ".") for p in ("ftd.supervisor", "ftd.client"))
            and name.split(".")[0] not in sys.stdlib_module_names
        )
        assert not bad, (
            f"{path.relative_to(PACKAGE.parent)} imports {bad}: the rank supervisor is stdlib only"
        )


def test_trainer_client_imports_only_the_standard_library() -> None:
    code = (
        "import sys, ftd.client; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'msgspec','structlog','aiomqtt','pluggy','aiohttp','amqtt','paho'} "
        "or (m.startswith('ftd.') and not m.startswith('ftd.client'))); print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- the floors of issue #8: contract, rules, daemons ------------------------------------------------


def _stdlib(name: str) -> bool:
    return name.split(".")[0] in sys.stdlib_module_names or name == "__future__"


def _within(name: str, *allowed: str) -> bool:
    return any(name == a or name.startswith(a + ".") for a in allowed)


def _files(folder: str) -> list[Path]:
    return sorted((PACKAGE / folder).rglob("*.py"))


def test_rules_import_only_the_contract_the_catalog_and_the_standard_library() -> None:
    for path in _files("rules"):
        bad = {
            n
            for n in imports_of(path)
            if not _stdlib(n) and not _within(n, "ftd.plugin", "ftd.catalog", "ftd.rules")
        }
        assert not bad, f"ftd/rules/{path.name} imports {sorted(bad)}: a rule imports only ftd.plugin"


def test_the_contract_depends_on_nothing_of_the_daemons() -> None:
    for path in _files("plugin"):
        bad = {
            n
            for n in imports_of(path)
            if not _stdlib(n) and not _within(n, "ftd.plugin", "ftd.events", "pluggy", "msgspec")
        }
        assert not bad, f"ftd/plugin/{path.name} imports {sorted(bad)}"


def test_the_coordinator_names_the_builtin_rules_as_strings_only() -> None:
    for path in _files("coordinator"):
        bad = {n for n in imports_of(path) if _within(n, "ftd.rules")}
        assert not bad, f"{path} imports {sorted(bad)}: built-in rules are loaded by name"


@pytest.mark.parametrize(("one", "other"), [("agent", "coordinator"), ("coordinator", "agent")])
def test_agent_and_coordinator_never_import_each_other(one: str, other: str) -> None:
    for path in _files(one):
        bad = {n for n in imports_of(path) if _within(n, f"ftd.{other}")}
        assert not bad, f"{path} imports {sorted(bad)}"
