"""Run ``ftd agent`` / ``ftd coordinator`` as real subprocesses with config files, for e2e tests:
:class:`ftd.bench.daemon.Daemon` run from the checkout (``REPO``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ftd.bench.daemon import Daemon as BenchDaemon

__all__ = ["REPO", "Daemon"]

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Daemon(BenchDaemon):
    cwd: Path | None = REPO
