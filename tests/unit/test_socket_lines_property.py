"""Property test of the trainer socket's line decoder (issue #20, item 8): whatever a line holds
(any bytes, any encoding, JSON nested to any depth, any size up to MAX_LINE), decoding it never
raises: it is a message or a BadLine with a readable error (the server answers it with ``error``).
The real-socket reproduction is tests/e2e/test_socket_bad_input.py."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.agent.local_api import wire
from ftd.client.protocol import MAX_LINE

OPENERS = [b"[", b'{"a":', b'{"op":"heartbeat","x":', b'{"op":"register","job":']


def _nested(opener: bytes, depth: int, closed: bool) -> bytes:
    closer = b"]" if opener == b"[" else b"}"
    body = opener * depth + b"1"
    return body + closer * depth if closed else body


def _check(line: bytes) -> None:
    result = wire.decode_line(line)
    if isinstance(result, wire.BadLine):
        assert isinstance(result.error, str) and result.error
        assert result.op is None or (isinstance(result.op, str) and len(result.op) <= 64)
        # the reply is one line of JSON, whatever the error says
        reply = wire.error_line(result.op, result.error)
        assert reply.endswith(b"\n") and reply.count(b"\n") == 1 and json.loads(reply)["op"] == "error"
    else:
        assert type(result) in wire.OPS


@settings(deadline=None)
@given(
    opener=st.sampled_from(OPENERS),
    depth=st.integers(min_value=0, max_value=(MAX_LINE - 32) // 24),
    closed=st.booleans(),
)
def test_any_nesting_decodes_without_raising(opener: bytes, depth: int, closed: bool) -> None:
    line = _nested(opener, depth, closed)
    assert len(line) <= MAX_LINE
    _check(line)


def test_the_deepest_lines_that_fit_decode_without_raising() -> None:
    for opener in OPENERS:
        depth = (MAX_LINE - 32) // (2 * len(opener))
        _check(_nested(opener, depth, closed=True))
        _check(_nested(opener, (MAX_LINE - 32) // len(opener), closed=False))


@given(st.binary(max_size=4096))
def test_any_bytes_decode_without_raising(raw: bytes) -> None:
    _check(raw)


@given(
    text=st.text(max_size=512),
    encoding=st.sampled_from(["utf-8", "utf-16", "utf-32", "latin-1"]),
)
def test_messages_in_any_encoding_decode_without_raising(text: str, encoding: str) -> None:
    msg = json.dumps({"v": 1, "op": "register", "job": text or "j", "rank": 0}, ensure_ascii=False)
    _check(msg.encode(encoding, errors="replace"))


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=40,
    ),
    st.sampled_from(["register", "heartbeat", "ack", "job_start", "nope", None]),
)
def test_any_json_value_under_any_op_decodes_without_raising(value: object, op: str | None) -> None:
    obj = {"v": 1, "op": op, "x": value, "job": value, "rank": value, "step": value}
    _check(json.dumps(obj).encode())
