"""Built-in rules: policy as pure functions of (event, read-only cluster view) -> action requests.

Each module imports only the rule contract (:mod:`ftd.plugin`), the Xid catalog and the standard
library (``tests/unit/test_layering.py`` enforces it), does no I/O, and is an ordinary pluggy plugin
an operator can disable by its name (``coordinator.disabled_rules = ["xid_catalog"]``). The
coordinator names them as strings (``ftd.coordinator.plugins.DEFAULT_RULES``), so nothing here is
imported until a plugin manager is built. Site policy an operator copies and edits lives in the
repository's top-level ``rules/`` folder, not here.

Built-in rules (each module's docstring has its table): ``xid_catalog`` (Xid buckets, Xid 154),
``ecc_remap`` (row remap pending/failure, SRAM uncorrectable), ``repeat_offender`` (same fault twice
in 24 h, a GPU that failed elsewhere), ``fs_fill`` (save while there is room, stop before full),
``hang`` (heartbeat lost / log stale), ``node_death`` (node offline with a job), ``straggler``.
"""
