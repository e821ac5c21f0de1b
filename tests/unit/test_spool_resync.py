"""Replaying a damaged spool resynchronises past the damage and keeps every intact record after it.

The spools are written by the real :class:`~ftd.agent.spool.Outbox`; the damage (bytes flipped,
deleted, inserted, replaced, anywhere, header included) is applied to the file's bytes; the record
boundaries the test reasons about are found by walking the documented format here, independently
of the reader under test. Version 1 spools (before the sync marker) are built here byte by byte
from the documented old format, as an agent before the upgrade left them.
"""

from __future__ import annotations

import functools
import struct
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftd.agent.spool import MAGIC, MAGIC_V1, RECORD_MARK, Outbox, Outgoing, read_spool, scan_spool
from ftd.bus.memory import MemoryBroker, MemoryBus
from tests.properties import examples


@dataclass(frozen=True)
class Rec:
    start: int
    end: int
    tag: bytes
    seq: int


def payload(i: int) -> bytes:
    # JSON-like, and every fifth one binary: a payload may hold the marker's bytes by chance.
    if i % 5 == 4:
        return RECORD_MARK + bytes(range(i % 7, 40)) + RECORD_MARK[:2]
    return b'{"id": "e%d", "data": {"code": %d, "msg": "%s"}}' % (i, 13 + i % 80, b"x" * (i * 7 % 50))


@functools.cache
def spool(n: int, done: frozenset[int]) -> bytes:
    """A spool of ``n`` events written by the real outbox; those in ``done`` were receipted after."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "outbox.spool"
        outbox = Outbox(MemoryBus(MemoryBroker()), path=path)
        for i in range(n):
            outbox.put(
                Outgoing(f"ftd/v1/nodes/n/events/k{i % 3}", payload(i), priority=i % 4, receipt_id=f"e{i}")
            )
        outbox.receipted(f"e{i}" for i in sorted(done))
        outbox.close()
        return path.read_bytes()


def records(data: bytes) -> list[Rec]:
    """The records of an undamaged spool (either version), by walking the documented layout."""
    v1 = data.startswith(MAGIC_V1)
    assert v1 or data.startswith(MAGIC)
    head = 8 if v1 else 12  # [marker] length crc
    out, pos = [], len(MAGIC)
    while pos < len(data):
        assert v1 or data[pos : pos + 4] == RECORD_MARK
        (length,) = struct.unpack_from("<I", data, pos + head - 8)
        body = data[pos + head : pos + head + length]
        out.append(Rec(pos, pos + head + length, body[:1], struct.unpack_from("<Q", body, 1)[0]))
        pos += head + length
    return out


def v1_record(body: bytes) -> bytes:
    return struct.pack("<II", len(body), zlib.crc32(body)) + body


def v1_spool(n: int, done: frozenset[int] = frozenset()) -> tuple[bytes, list[int]]:
    """A version-1 spool of ``n`` events and tombstones for ``done``; also each record's offset."""
    out, offsets = bytearray(MAGIC_V1), []
    for i in range(n):
        topic, rid = f"ftd/v1/nodes/n/events/k{i % 3}".encode(), f"e{i}".encode()
        offsets.append(len(out))
        out += v1_record(
            struct.pack("<cQBBHH", b"R", i + 1, i % 4, 0, len(topic), len(rid)) + topic + rid + payload(i)
        )
    for i in sorted(done):
        offsets.append(len(out))
        out += v1_record(struct.pack("<cQ", b"D", i + 1))
    return bytes(out), offsets


# A damage: (offset, modulo the file's size + 1; how many original bytes it covers; what replaces
# them, None: the same bytes, every one flipped).
Damage = tuple[int, int, bytes | None]


def apply(data: bytes, damages: list[Damage]) -> tuple[bytes, list[tuple[int, int, bytes]]]:
    """Apply non-overlapping damages (later ones overlapping earlier ones are left out); returns the
    damaged bytes and the damages applied, as (offset, bytes removed, bytes put there instead)."""
    kept: list[tuple[int, int, bytes]] = []
    for at, size, new in sorted(((a % (len(data) + 1), s, n) for a, s, n in damages), key=lambda d: d[0]):
        size = min(size, len(data) - at)
        if kept and at < kept[-1][0] + max(kept[-1][1], 1):
            continue
        old = data[at : at + size]
        kept.append((at, size, bytes(b ^ 0xA5 for b in old) if new is None else new))
    out, pos = bytearray(), 0
    for at, size, replacement in kept:
        out += data[pos:at] + replacement
        pos = at + size
    out += data[pos:]
    return bytes(out), kept


def intact(rec: Rec, clean: bytes, damaged: bytes, applied: list[tuple[int, int, bytes]]) -> bool:
    """Whether ``rec``'s bytes are all still there, in one piece, where the damage shifted them (a
    damage that happens to leave them as they were leaves them intact)."""
    shift = 0
    for at, size, replacement in applied:
        if at + size <= rec.start:  # wholly before the record (an insertion at its start too)
            shift += len(replacement) - size
        elif at <= rec.start:  # over the record's start: its first bytes may be the replacement's last
            into = at + size - rec.start
            if into > len(replacement):
                return False
            shift += len(replacement) - size
    start = rec.start + shift
    return start >= 0 and damaged[start : start + rec.end - rec.start] == clean[rec.start : rec.end]


damage = st.tuples(
    st.integers(0, 6000),
    st.integers(0, 80),
    st.one_of(st.none(), st.binary(max_size=80)),
)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    version=st.sampled_from([2, 1]),
    n=st.integers(1, 40),
    done=st.frozensets(st.integers(0, 39), max_size=15),
    damages=st.lists(damage, min_size=1, max_size=6),
)
def test_random_damage_never_raises_and_every_untouched_record_is_recovered(
    version: int, n: int, done: frozenset[int], damages: list[Damage]
) -> None:
    done = frozenset(i for i in done if i < n)
    clean = spool(n, done) if version == 2 else v1_spool(n, done)[0]
    recs = records(clean)
    originals = {e.seq: e for e in scan_spool(clean).entries}
    written = {r.seq for r in recs if r.tag == b"R"}
    data, applied = apply(clean, damages)

    scan = scan_spool(data)  # never raises
    entries, _, problem = read_spool(data)
    got = {e.seq: e for e in scan.entries}
    assert [e.seq for e in entries] == [e.seq for e in scan.entries]
    whole = [r for r in recs if intact(r, clean, data, applied)]
    intact_put = {r.seq for r in whole if r.tag == b"R"}
    intact_del = {r.seq for r in whole if r.tag == b"D"}
    for seq in intact_put - intact_del:  # recovered, exactly (a damaged tombstone brings it back)
        assert got[seq] == originals.get(seq, got[seq])
        assert (got[seq].topic, got[seq].payload, got[seq].receipt_id) == (
            f"ftd/v1/nodes/n/events/k{(seq - 1) % 3}",
            payload(seq - 1),
            f"e{seq - 1}",
        )
    assert not set(got) & intact_del  # an intact tombstone keeps its entry done
    assert set(got) <= written  # nothing made up
    assert all(got[seq] == originals.get(seq, got[seq]) for seq in got)
    assert scan.records >= len(whole)
    if data == clean:
        assert problem is None
    elif problem is not None:
        assert scan.skipped_bytes > 0 or not scan.header_ok
        assert scan.skipped_bytes <= len(data)


def test_damage_in_the_middle_keeps_the_records_after_it_and_counts_what_was_skipped() -> None:
    clean = spool(10, frozenset())
    recs = records(clean)
    data = bytearray(clean)
    bad = recs[4]
    data[bad.start + 20 : bad.start + 30] = bytes(10)  # inside record 5's body: CRC mismatch
    scan = scan_spool(bytes(data))
    assert [e.payload for e in scan.entries] == [payload(i) for i in range(10) if i != 4]
    assert scan.records == 9 and scan.regions == 1
    assert scan.skipped_bytes == bad.end - bad.start
    assert (
        scan.problem
        == f"1 damaged region, {bad.end - bad.start} bytes skipped; first: CRC mismatch at byte {bad.start}"
    )


def test_a_torn_tail_loses_only_the_torn_record() -> None:
    clean = spool(6, frozenset())
    last = records(clean)[-1]
    scan = scan_spool(clean[: last.start + 7])
    assert [e.payload for e in scan.entries] == [payload(i) for i in range(5)]
    assert scan.skipped_bytes == 7 and "truncated record" in (scan.problem or "")


def test_a_damaged_header_does_not_lose_the_records() -> None:
    clean = spool(5, frozenset({1}))
    scan = scan_spool(b"FTDSPLX\n" + clean[len(MAGIC) :])
    assert [e.payload for e in scan.entries] == [payload(i) for i in (0, 2, 3, 4)]
    assert not scan.header_ok and scan.problem is not None and "bad file header" in scan.problem


def test_garbage_is_reported_not_raised() -> None:
    for data in (
        b"this is not a spool file at all",
        b"\x00" * 5000,
        RECORD_MARK * 100,
        b"FTDSPL1\n" + b"R" * 300,
    ):
        scan = scan_spool(data)
        assert scan.entries == [] and scan.problem is not None


# --- version 1 (before the sync marker) -------------------------------------------------------------


def test_a_version_1_spool_is_read_and_rewritten_in_the_current_format(tmp_path: Path) -> None:
    data, _ = v1_spool(6, frozenset({2}))
    path = tmp_path / "outbox.spool"
    path.write_bytes(data)
    outbox = Outbox(MemoryBus(MemoryBroker()), path=path)
    assert outbox.replayed == 5 and outbox.damage == []
    assert [e.payload for e in outbox._queue] == [payload(i) for i in (0, 1, 3, 4, 5)]
    assert [e.receipt_id for e in outbox._queue] == ["e0", "e1", "e3", "e4", "e5"]
    outbox.put(Outgoing("t/new", b"after the upgrade", receipt_id="new"))
    outbox.close()
    upgraded = path.read_bytes()
    assert upgraded.startswith(MAGIC)
    scan = scan_spool(upgraded)
    assert scan.problem is None and scan.version == 2
    assert [e.receipt_id for e in scan.entries] == ["e0", "e1", "e3", "e4", "e5", "new"]
    assert scan.top == 7  # sequence numbers go on after the old file's


def test_a_damaged_version_1_spool_resynchronises_too() -> None:
    data, offsets = v1_spool(10)
    damaged = bytearray(data)
    damaged[offsets[3] + 2 : offsets[5] + 5] = b"\x07" * (offsets[5] + 3 - offsets[3])  # records 4 to 6
    scan = scan_spool(bytes(damaged))
    assert [e.payload for e in scan.entries] == [payload(i) for i in (0, 1, 2, 6, 7, 8, 9)]
    assert scan.version == 1 and scan.regions == 1 and scan.skipped_bytes == offsets[6] - offsets[3]
