"""Layering rules (DESIGN §3), checked on the source: who may import what."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "ftd"


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def importers_of(top_level: str) -> list[str]:
    return sorted(
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if any(name == top_level or name.startswith(top_level + ".") for name in imports_of(path))
    )


@pytest.mark.parametrize(
    ("library", "allowed"),
    [("aiomqtt", ["ftd/bus/mqtt.py"]), ("paho", []), ("pynvml", ["ftd/agent/watchers/nvml/real.py"])],
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
        "ftd.coordinator.ledger",
    }
    for path in (PACKAGE / "rules").glob("*.py"):
        bad = {n for n in imports_of(path) if n in forbidden or any(n.startswith(f + ".") for f in forbidden)}
        assert not bad, f"{path.name} imports {sorted(bad)}: rules are pure, I/O belongs to executors"


# The framework adapters may import the framework they adapt, and nothing else outside the stdlib.
_CLIENT_FRAMEWORKS = {
    "torch.py": {"torch"},
    "lightning.py": {"lightning", "pytorch_lightning", "torch"},
    "hf.py": {"transformers", "torch"},
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


def test_trainer_client_imports_only_the_standard_library() -> None:
    code = (
        "import sys, ftd.client; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'msgspec','structlog','aiomqtt','pluggy','aiohttp','amqtt','paho'} "
        "or (m.startswith('ftd.') and not m.startswith('ftd.client'))); print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
