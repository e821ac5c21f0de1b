"""Flight-recorder JSON dumps (real gloo ones from torch 2.13, in tests/unit/culprit_dumps/) read, and
hostile dumps refused with a reason: pickles never unpickled, deep nesting, huge numbers, wrong types."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as hs

from ftd.culprit.evidence import MAX_FLIGHT_ENTRIES, FlightEntry, FlightPgStatus
from ftd.culprit.flight import MAX_INPUT, last_enqueued, parse_flight_json
from tests.properties import examples

DUMPS = Path(__file__).with_name("culprit_dumps")


def test_real_gloo_dump_of_a_rank_waiting_in_its_fourth_all_reduce() -> None:
    record, error = parse_flight_json((DUMPS / "flight_gloo_r0_waiting.json").read_bytes())
    assert error == "" and record is not None
    assert record.version == "2.10"
    assert record.entries[-1] == FlightEntry(seq=4, pg="0", op="gloo:all_reduce", state="scheduled")
    assert [e.seq for e in record.entries] == [1, 2, 3, 4]
    assert record.pg_status == {"0": FlightPgStatus(last_enqueued=4, last_started=None, last_completed=3)}
    assert last_enqueued(record) == {"0": 4}


def test_real_gloo_dump_of_the_rank_that_never_issued_it() -> None:
    record, error = parse_flight_json((DUMPS / "flight_gloo_r1_behind.json").read_text())
    assert error == "" and record is not None
    assert last_enqueued(record) == {"0": 3}


def test_a_pickle_is_refused_never_unpickled() -> None:
    class Boom:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("unpickled!",))

    record, error = parse_flight_json(pickle.dumps({"version": "2.10", "entries": [Boom()]}))
    assert record is None and "pickle" in error and "refused" in error


def test_only_the_newest_entries_are_kept() -> None:
    entries = [
        {"collective_seq_id": i, "pg_id": 0, "profiling_name": "nccl:all_reduce"} for i in range(1, 2001)
    ]
    record, error = parse_flight_json(json.dumps({"version": "2.10", "entries": entries}))
    assert error == "" and record is not None
    assert len(record.entries) == MAX_FLIGHT_ENTRIES and record.entries[-1].seq == 2000


def test_hostile_dumps_are_refused_clearly() -> None:
    cases = {
        "[" * 50_000 + "]" * 50_000: "not a JSON object",
        '{"entries": ' + "[" * 50_000 + "]" * 50_000 + "}": "refused",
        '{"pg_config": '
        + "[" * 200_000
        + "]" * 200_000
        + ', "entries": [{"collective_seq_id": 1}]}': "deeply",
        '{"entries": [{"collective_seq_id": ' + "9" * 400 + "}]}": "refused",
        '{"entries": [{"collective_seq_id": "seven"}]}': "refused",
        '{"entries": {"a": 1}}': "refused",
        '{"pg_status": {"0": {"last_enqueued_collective": [1]}}}': "refused",
        '{"version": "2.10", "entries": []}': "no collective",
        "": "empty",
        "{": "refused",
    }
    for text, said in cases.items():
        record, error = parse_flight_json(text)
        assert record is None and said in error, (text[:60], error)
    assert parse_flight_json(b" " + b"{" * (MAX_INPUT + 1))[1].endswith("limit")
    assert "not text or bytes" in parse_flight_json(3)[1]  # type: ignore[arg-type]


def test_odd_counters_are_read_as_none() -> None:
    text = json.dumps(
        {"pg_status": {"0": {"last_enqueued_collective": "-1", "last_completed_collective": "x"}}}
    )
    record, error = parse_flight_json(text)
    assert error == "" and record is not None
    assert record.pg_status["0"] == FlightPgStatus()


json_values = hs.recursive(
    hs.none() | hs.booleans() | hs.integers() | hs.floats() | hs.text(max_size=10),
    lambda inner: hs.lists(inner, max_size=4) | hs.dictionaries(hs.text(max_size=12), inner, max_size=4),
    max_leaves=30,
)
keys = hs.sampled_from(["version", "entries", "pg_status", "collective_seq_id", "pg_id", "state", "x"])
shaped = hs.recursive(
    json_values,
    lambda inner: hs.lists(inner, max_size=4) | hs.dictionaries(keys, inner, max_size=4),
    max_leaves=40,
)


@settings(max_examples=examples(400))
@given(hs.one_of(shaped.map(json.dumps), hs.binary(max_size=200), hs.text(max_size=200)))
def test_arbitrary_input_never_raises(data: str | bytes) -> None:
    record, error = parse_flight_json(data)
    assert (record is None) != (error == "")
    if record is not None:
        assert len(record.entries) <= MAX_FLIGHT_ENTRIES
