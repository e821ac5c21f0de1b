"""WAL checkpoints of the SQLite ledger, off the coordinator's event loop.

What: :class:`WalCheckpointer`, a daemon thread with its own connection to the ledger file that runs
``PRAGMA wal_checkpoint(PASSIVE)`` every ``interval_s`` while the write-ahead log has frames to copy
back, and once more when stopped. The ledger's own connection turns SQLite's automatic checkpoint off
(``wal_autocheckpoint=0``).

Why: the ledger is written synchronously on the event loop (a commit costs ~0.1 ms), but SQLite's
automatic checkpoint runs *inside* the commit that pushes the log past 1,000 pages, and with
``synchronous=NORMAL`` a checkpoint syncs the log and the database to disk: several milliseconds
during which the loop cannot pass a directive on. Measured with ``ftd bench e2e`` (issue #25): the
ledger on tmpfs took 2-6 ms off the p99 of the current code, whose actions write more rows than
the release of c38d582. A passive checkpoint never blocks the ledger's writer or its readers (SQLite
copies what no reader still needs), and sqlite3 releases the GIL while it does the I/O, so the loop
goes on. Durability is unchanged: commits are durable against a process crash either way, and as
before the log reaches the disk at checkpoints.
"""

from __future__ import annotations

import sqlite3
import threading

from ftd.logs import get_logger

log = get_logger(__name__)

__all__ = ["WalCheckpointer"]

DEFAULT_INTERVAL_S = 1.0


class WalCheckpointer:
    """Checkpoints ``path``'s write-ahead log from a thread (see the module docstring)."""

    def __init__(self, path: str, *, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.path = path
        self.interval_s = interval_s
        self.checkpoints = 0  # checkpoints that copied frames back
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ledger-checkpoint", daemon=True)

    def start(self) -> WalCheckpointer:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after one last checkpoint (the log is short when the ledger reopens)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=True)
        except sqlite3.Error as exc:
            log.warning("ledger_checkpoint_unavailable", path=self.path, error=str(exc)[:300])
            return
        try:
            while not self._stop.wait(self.interval_s):
                self.checkpoint(db)
            self.checkpoint(db)
        finally:
            db.close()

    def checkpoint(self, db: sqlite3.Connection) -> None:
        """One passive checkpoint; a busy or failing one is logged and tried again next time."""
        try:
            busy, frames, copied = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as exc:
            self.errors += 1
            if self.errors in (1, 10, 100) or self.errors % 1000 == 0:
                error = str(exc)[:300]
                log.warning("ledger_checkpoint_failed", path=self.path, error=error, errors=self.errors)
            return
        if copied > 0:
            self.checkpoints += 1
        if busy and frames > 100_000:  # ~400 MB of log: something holds a reader open for long
            log.warning("ledger_wal_growing", path=self.path, frames=frames, copied=copied)
