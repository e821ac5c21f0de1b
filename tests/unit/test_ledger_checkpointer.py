"""The ledger's WAL checkpoints run in a thread, never inside a commit on the event loop (issue #25:
an automatic checkpoint syncs the log and the database to disk in the middle of a commit)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from ftd.coordinator.ledger.checkpointer import WalCheckpointer
from ftd.coordinator.ledger.sqlite import Ledger


def wal_frames(db: sqlite3.Connection) -> tuple[int, int]:
    """(frames in the log, frames already copied back), without copying anything (a NOOP is not
    available, so a PASSIVE checkpoint of what is left: done by the thread already, it copies 0)."""
    _, frames, copied = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return frames, copied


def test_the_thread_copies_the_log_back_while_the_writer_goes_on(tmp_path: Path) -> None:
    path = str(tmp_path / "l.sqlite")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA wal_autocheckpoint=0")
    db.execute("CREATE TABLE t (x BLOB)")
    checkpointer = WalCheckpointer(path, interval_s=0.02).start()
    try:
        for _ in range(300):  # ~300 commits of a page each: past nothing automatic, autocheckpoint is off
            db.execute("INSERT INTO t VALUES (?)", (b"x" * 3000,))
        deadline = time.monotonic() + 10
        while checkpointer.checkpoints == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert checkpointer.checkpoints >= 1 and checkpointer.errors == 0
    finally:
        checkpointer.stop()
    assert not checkpointer._thread.is_alive()
    frames, copied = wal_frames(db)
    assert frames == copied  # the final checkpoint on stop left nothing behind
    assert db.execute("SELECT count(*) FROM t").fetchone() == (300,)
    db.close()


def test_the_ledger_turns_the_automatic_checkpoint_off_and_runs_the_thread(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    try:
        assert ledger._db.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
        assert ledger._checkpointer is not None and ledger._checkpointer._thread.is_alive()
    finally:
        ledger.close()
    assert not ledger._checkpointer._thread.is_alive()
    assert Ledger(":memory:")._checkpointer is None  # no file, no log
