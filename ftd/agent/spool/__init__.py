"""The agent's outbox and its durable spool: everything the agent publishes waits here until done.

Layout: :mod:`ftd.agent.spool.outbox` (the :class:`Outbox`: ordering, bounds, receipts, going
memory-only on storage faults and back), :mod:`ftd.agent.spool.file` (the spool file: append, cut
back, rewrite, quarantine) and :mod:`ftd.agent.spool.records` (the record format and reading it back
after damage). This face re-exports the names the agent and the tests use.
"""

from __future__ import annotations

from ftd.agent.spool.outbox import Outbox, Outgoing
from ftd.agent.spool.records import (
    MAGIC,
    MAGIC_V1,
    RECORD_MARK,
    SpoolCorrupt,
    SpoolDamage,
    SpoolScan,
    read_spool,
    scan_spool,
)

__all__ = [
    "MAGIC",
    "MAGIC_V1",
    "RECORD_MARK",
    "Outbox",
    "Outgoing",
    "SpoolCorrupt",
    "SpoolDamage",
    "SpoolScan",
    "read_spool",
    "scan_spool",
]
