"""``ftd run [options] -- <training command>``: this node's rank supervisor (issue #24).

The parser and the command live in :mod:`ftd.supervisor.cli` (standard library only, so that
``python -m ftd.supervisor`` runs the same on the trainer-only install); this module registers it
under ``ftd``.
"""

from __future__ import annotations

from ftd.supervisor.cli import register

__all__ = ["register"]
