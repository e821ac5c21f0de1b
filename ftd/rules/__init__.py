"""Built-in rules: policy as pure functions of (event, read-only cluster view) -> action requests.

They live inside the ``ftd`` package (rather than a top-level ``rules`` package as DESIGN §3 sketches)
because a top-level module named ``rules`` would collide with other distributions once installed;
the principle stands — nothing here does I/O, and each module is an ordinary pluggy plugin that
an operator can disable by its name (``coordinator.disabled_rules = ["xid_catalog"]``).

Built-in rules (each module's docstring has its table): ``xid_catalog`` (Xid buckets, Xid 154),
``ecc_remap`` (row remap pending/failure, SRAM uncorrectable), ``repeat_offender`` (same fault twice
in 24 h, a GPU that failed elsewhere), ``fs_fill`` (save while there is room, stop before full),
``hang`` (heartbeat lost / log stale), ``node_death`` (node offline with a job), ``straggler``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

_NAMES = ("xid_catalog", "ecc_remap", "repeat_offender", "fs_fill", "hang", "node_death", "straggler")


def BUILTIN_RULES() -> list[ModuleType]:
    return [importlib.import_module(f"ftd.rules.{name}") for name in _NAMES]
