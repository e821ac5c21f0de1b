"""Built-in rules: policy as pure functions of (event, read-only cluster view) -> action requests.

They live inside the ``ftd`` package (rather than a top-level ``rules`` package as DESIGN §3 sketches)
because a top-level module named ``rules`` would collide with other distributions once installed;
the principle stands — nothing here does I/O, and each module is an ordinary pluggy plugin that
an operator can disable by its name (``coordinator.disabled_rules = ["xid_catalog"]``).
"""

from __future__ import annotations

import importlib
from types import ModuleType

_NAMES = ("xid_catalog",)


def BUILTIN_RULES() -> list[ModuleType]:
    return [importlib.import_module(f"ftd.rules.{name}") for name in _NAMES]
