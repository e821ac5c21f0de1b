"""Wire codec: round trips, strict types, tolerance of unknown fields, unique ids."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ftd.events import (
    SCHEMA_VERSION,
    Ack,
    DecodeError,
    Directive,
    Event,
    Kind,
    Severity,
    decode,
    encode,
    make_event,
    new_id,
)

json_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=10,
)

events = st.builds(
    Event,
    id=st.text(min_size=1, max_size=40),
    ts=st.floats(min_value=0, max_value=4e9, allow_nan=False),
    node=st.text(min_size=1, max_size=30),
    kind=st.sampled_from(list(Kind)),
    severity=st.sampled_from(list(Severity)),
    source=st.text(max_size=10),
    data=st.dictionaries(st.text(max_size=10), json_values, max_size=5),
    count=st.integers(1, 10**9),
)


@given(events)
def test_event_round_trip(event: Event) -> None:
    assert decode(encode(event), Event) == event


@given(
    events,
    st.dictionaries(
        st.text(min_size=1, max_size=10).filter(lambda k: k not in Event.__struct_fields__),
        json_values,
        max_size=3,
    ),
)
def test_unknown_fields_are_ignored(event: Event, extra: dict[str, object]) -> None:
    doc = json.loads(encode(event))
    doc.update(extra)
    assert decode(json.dumps(doc), Event) == event


@pytest.mark.parametrize(
    "mutation",
    [
        {"ts": "yesterday"},
        {"kind": "not-a-kind"},
        {"severity": "apocalyptic"},
        {"count": "3"},
        {"node": 7},
        {"data": []},
        {"schema": SCHEMA_VERSION + 1},
    ],
)
def test_wrong_types_and_unknown_kinds_are_decode_errors(mutation: dict[str, object]) -> None:
    doc = json.loads(encode(make_event("node-1", Kind.XID, data={"code": 79})))
    doc.update(mutation)
    with pytest.raises(DecodeError):
        decode(json.dumps(doc), Event)


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise_anything_but_decode_error(payload: bytes) -> None:
    for type_ in (Event, Directive, Ack):
        with contextlib.suppress(DecodeError):
            decode(payload, type_)


def test_missing_required_field_is_reported_by_name() -> None:
    doc = json.loads(encode(make_event("node-1", Kind.XID)))
    del doc["node"]
    with pytest.raises(DecodeError, match="node"):
        decode(json.dumps(doc), Event)


def test_ids_are_unique_and_carry_the_prefix() -> None:
    ids = {new_id("node-1") for _ in range(10_000)}
    assert len(ids) == 10_000
    assert all(i.startswith("node-1-") for i in ids)
