"""A corrupt ledger under a real ``ftd coordinator`` (docs/architecture.md §11.2: storage faults are reported,
never fatal).

Operators reported: a corrupt ledger file made the coordinator die with a raw ``sqlite3.DatabaseError``
traceback, exit 1, and systemd restarted it into the same failure. Now the coordinator moves the
corrupt file aside (renamed with a UTC timestamp, its WAL and shared-memory files with it), logs one
error line saying so, starts on a new ledger whose first event (``agent_health`` from node
``ftd-coordinator``) says what happened, and runs: never a crash loop, never silently.

Failing first, for both kinds of damage (garbage over the header, garbage over b-tree pages): the
coordinator never came online; it exited with ``cannot start: DatabaseError: file is not a
database`` (or ``database disk image is malformed``) -- one line and exit status 2 since the
start-up error handling in ``ftd.commands.daemons``, which stops systemd restarting it: down for good.
"""

from __future__ import annotations

import json
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftd.coordinator.ledger.sqlite import NOTICE_NODE, Ledger
from ftd.events import Kind, encode, make_event
from tests.chaos.test_poison import CoordinatorRig, NodeClient, control
from tests.realparts import Mosquitto


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[CoordinatorRig, NodeClient]]:
    broker = Mosquitto(tmp_path / "mosq").start()
    node = NodeClient(broker.port, "node-1")
    coordinator = CoordinatorRig(tmp_path, broker)
    try:
        yield coordinator, node
    finally:
        coordinator.stop()
        node.close()
        broker.stop()


def write_ledger(path: Path, events: int) -> None:
    ledger = Ledger(path)
    with ledger.transaction():
        for i in range(events):
            ledger.record_event(make_event("node-1", Kind.GPU_HEALTH, data={"i": i, "pad": "x" * 100}))
    ledger._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    ledger.close()


def moved_aside(path: Path) -> list[Path]:
    found = path.parent.glob(f"{path.name}.corrupt-*")
    return [p for p in found if not p.name.endswith(("-wal", "-shm"))]


def notices(coordinator: CoordinatorRig) -> list[dict[str, object]]:
    sql = "SELECT body FROM events WHERE node = 'ftd-coordinator' AND kind = 'agent_health'"
    return [json.loads(body) for (body,) in coordinator.rows(sql)]


def error_lines(coordinator: CoordinatorRig) -> list[str]:
    return [line for line in coordinator.daemon.log().splitlines() if "ledger_corrupt" in line]


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("where", ["header", "pages"])
def test_corrupt_ledger_is_moved_aside_reported_and_the_coordinator_runs(
    rig: tuple[CoordinatorRig, NodeClient], where: str
) -> None:
    coordinator, node = rig
    path = coordinator.ledger
    path.parent.mkdir(parents=True)
    write_ledger(path, 2000)
    data = bytearray(path.read_bytes())
    if where == "header":
        data[:100] = b"\xde\xad\xbe\xef" * 25  # garbage over the SQLite header
    else:
        middle = len(data) // 2 // 4096 * 4096
        data[middle : middle + 3 * 4096] = b"\x5a" * (3 * 4096)  # garbage over b-tree pages
    path.write_bytes(bytes(data))

    coordinator.start(node)  # before: exit status != 0 with a DatabaseError, never online
    [moved] = moved_aside(path)
    assert moved.read_bytes() == bytes(data)  # kept as it was, for a post-mortem
    [line] = error_lines(coordinator)
    record = json.loads(line)
    assert record["level"] == "error" and record["moved_to"] == str(moved)
    [notice] = notices(coordinator)
    assert notice["source"] == "coordinator" and notice["severity"] == "critical"
    assert notice["data"]["problem"] == "ledger_corrupt"
    assert notice["data"]["moved_to"] == str(moved)

    control(node, coordinator)  # the new ledger takes events
    good = make_event("node-1", Kind.XID, data={"code": 43})
    node.publish("events/xid", encode(good))

    # A restart finds a sound ledger: nothing moved again, no new notice, no crash.
    assert coordinator.daemon.stop(signal.SIGTERM) == 0
    coordinator.start(node)
    control(node, coordinator)
    assert moved_aside(path) == [moved]
    assert len(notices(coordinator)) == 1
    assert good.id in coordinator.event_ids("node-1")
    assert coordinator.alive()


# In-process (no real parts): the same recovery, and what is *not* taken for corruption.


def test_ledger_on_a_garbage_file_moves_it_aside_and_notes_it(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(b"\x00not a database\x00" * 500)
    ledger = Ledger(path)
    [moved] = moved_aside(path)
    assert ledger.moved_aside == moved and moved.read_bytes() == b"\x00not a database\x00" * 500
    [notice] = ledger.events()
    assert notice.kind == Kind.AGENT_HEALTH and notice.node == NOTICE_NODE
    assert notice.data["problem"] == "ledger_corrupt" and "not a database" in notice.data["error"]
    ledger.close()
    again = Ledger(path)  # sound now: nothing moved, the notice is still the only event
    assert again.moved_aside is None and moved_aside(path) == [moved] and len(again.events()) == 1
    again.close()


def test_a_ledger_that_cannot_be_opened_is_not_taken_for_a_corrupt_one(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    path.mkdir()  # a directory where the file belongs: SQLite cannot open it, but it is nothing corrupt
    with pytest.raises(sqlite3.OperationalError):
        Ledger(path)
    assert path.is_dir() and moved_aside(path) == []
