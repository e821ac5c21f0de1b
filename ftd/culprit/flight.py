"""PyTorch's flight recorder, read from its JSON dump: which collectives a rank issued, and how far each
process group got.

Torch 2.13 keeps a ring buffer of collectives per process (``TORCH_FR_BUFFER_SIZE`` entries; 0, the
default, records nothing) for NCCL *and* gloo, and dumps it with
``torch._C._distributed_c10d._dump_fr_trace_json(includeCollectives, onlyActive)`` as JSON bytes
(``_dump_fr_trace`` gives the same as a pickle, which is what torch's own ``fr_trace`` tool reads and
what the NCCL watchdog writes to ``TORCH_FR_DUMP_TEMP_FILE`` on a timeout). The JSON, version ``2.10``
here: ``{"version", "comm_lib_version", "entries": [...], "pg_config", "pg_status", "nccl_comm_state"}``;
each entry carries ``collective_seq_id``, ``pg_id``, ``process_group`` (``[id, name]``),
``profiling_name`` (``gloo:all_reduce``, ``nccl:all_reduce``), ``state`` (``scheduled``, ``started``,
``completed``; gloo leaves every entry ``scheduled``), ``retired``, sizes, dtypes and times;
``pg_status`` maps a pg id to ``last_enqueued_collective``, ``last_started_collective`` and
``last_completed_collective`` as decimal strings (``"-1"``: none).

:func:`parse_flight_json` keeps what a verdict needs (seq, pg, op, state per entry, the newest
:data:`~ftd.culprit.evidence.MAX_FLIGHT_ENTRIES`; the pg summaries) and refuses the rest with a reason:
a pickle is never unpickled (unpickling runs code), and deep nesting, numbers beyond 64 bits, wrong
types and oversized dumps are refused with a sentence, never an exception.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from ftd.culprit.evidence import (
    MAX_FLIGHT_ENTRIES,
    MAX_FLIGHT_PGS,
    MAX_TEXT,
    FlightEntry,
    FlightPgStatus,
    FlightRecord,
)

MAX_INPUT = 32 * 1024 * 1024  # bytes of one dump read at most (2,000 entries take about 1 MB)


Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]  # a bigger number is refused


class _Entry(msgspec.Struct):
    collective_seq_id: Int64 | None = None
    pg_id: Int64 | str | None = None
    process_group: list[str] | None = None
    profiling_name: str | None = None
    state: str | None = None


class _PgStatus(msgspec.Struct):
    last_enqueued_collective: str | Int64 | None = None
    last_started_collective: str | Int64 | None = None
    last_completed_collective: str | Int64 | None = None


class _Dump(msgspec.Struct):
    version: str | Int64 | float | None = None
    entries: list[_Entry] | None = None
    pg_status: dict[str, _PgStatus] | None = None


_DECODER = msgspec.json.Decoder(_Dump)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..."


def _seq(value: str | int | None) -> int | None:
    """A pg_status counter: a non-negative int or its decimal string; -1, absent or junk -> None."""
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str) and value.isdecimal() and len(value) <= 18:
        return int(value)
    return None


def parse_flight_json(text: str | bytes) -> tuple[FlightRecord | None, str]:
    """A flight-recorder JSON dump -> (the record, "") or (None, why it was refused). Never raises."""
    try:
        return _parse(text)
    except Exception as exc:  # the promise is "never raises"
        return None, _cut(f"flight-recorder dump unreadable: {type(exc).__name__}: {exc}")


def _parse(text: str | bytes) -> tuple[FlightRecord | None, str]:
    if isinstance(text, str):
        data = text.encode("utf-8", errors="replace")
    elif isinstance(text, (bytes, bytearray, memoryview)):
        data = bytes(text)
    else:
        return None, f"flight-recorder dump is {type(text).__name__}, not text or bytes"
    if not data.strip():
        return None, "flight-recorder dump is empty"
    if data[:1] == b"\x80":
        return None, (
            "flight-recorder dump is a pickle (torch's _dump_fr_trace / TORCH_FR_DUMP_TEMP_FILE): refused, "
            "unpickling runs code; dump it as JSON (_dump_fr_trace_json) instead"
        )
    if len(data) > MAX_INPUT:
        return None, f"flight-recorder dump is {len(data)} bytes, over the {MAX_INPUT}-byte limit"
    if data.lstrip()[:1] != b"{":
        return None, "flight-recorder dump is not a JSON object"
    try:
        dump = _DECODER.decode(data)
    except msgspec.DecodeError as exc:  # includes ValidationError: wrong types, numbers over 64 bits
        return None, _cut(f"flight-recorder JSON refused: {exc}")
    except RecursionError:  # deep nesting in a field skipped (pg_config, sizes)
        return None, "flight-recorder JSON refused: nested too deeply"
    raw = dump.entries or []
    if len(raw) > MAX_FLIGHT_ENTRIES:
        raw = raw[-MAX_FLIGHT_ENTRIES:]
    entries: list[FlightEntry] = []
    for item in raw:
        if item.collective_seq_id is None or item.collective_seq_id < 0:
            continue  # point-to-point entries carry collective_seq_id 0; junk has none
        pg = item.pg_id if item.pg_id is not None else (item.process_group or [""])[0]
        entries.append(
            FlightEntry(
                seq=item.collective_seq_id,
                pg=_cut(str(pg)),
                op=_cut(item.profiling_name or ""),
                state=_cut(item.state or ""),
            )
        )
    status: dict[str, FlightPgStatus] = {}
    for key, value in list((dump.pg_status or {}).items())[:MAX_FLIGHT_PGS]:
        status[_cut(key)] = FlightPgStatus(
            last_enqueued=_seq(value.last_enqueued_collective),
            last_started=_seq(value.last_started_collective),
            last_completed=_seq(value.last_completed_collective),
        )
    if not entries and not status:
        return None, "flight-recorder dump holds no collective (is TORCH_FR_BUFFER_SIZE set above 0?)"
    version = "" if dump.version is None else _cut(str(dump.version))
    return FlightRecord(entries=entries, version=version, pg_status=status), ""


def last_enqueued(record: FlightRecord) -> dict[str, int]:
    """pg -> the highest collective seq this rank issued there (entries and pg_status together)."""
    out: dict[str, int] = {}
    for entry in record.entries:
        if entry.seq > out.get(entry.pg, -1):
            out[entry.pg] = entry.seq
    for pg, status in record.pg_status.items():
        if status.last_enqueued is not None and status.last_enqueued > out.get(pg, -1):
            out[pg] = status.last_enqueued
    return out
