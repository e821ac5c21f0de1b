"""The parts of ``ftd bench scale`` that need no broker: MQTT packets, password entries, the layout.

The bench itself runs against a real Mosquitto in tests/e2e/test_bench_scale.py.
"""

from __future__ import annotations

import asyncio
import base64
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.bench.mosquitto_auth import password_entry
from ftd.bench.mqtt_lite import LiteSession, Will, connect_packet, publish_packet, subscribe_packet
from ftd.bench.scale import layout
from tests.properties import examples

# Written by Mosquitto 2.0.11's `mosquitto_passwd -c -b pw u1 secret`.
MOSQUITTO_PASSWD_LINE = (
    "u1:$7$101$kxLIfQ2wjd7qTZww$agUqEc3cBYRwrxjwjOIVhqw5AxwJy2gbRup6vRf4GXpBzLMWyEm1xbp7EMdkcJXzFesi662c8Y"
    "IU8L6DoruVug=="
)


def read_packet(raw: bytes) -> tuple[int, bytes]:
    """Parse ``raw`` with the session's own reader (one packet, nothing left over)."""

    async def main() -> tuple[int, bytes]:
        session = LiteSession("127.0.0.1", 1, "t")
        reader = asyncio.StreamReader()
        reader.feed_data(raw)
        reader.feed_eof()
        session._reader = reader
        packet = await session._read_packet()
        assert await reader.read() == b""
        return packet

    return asyncio.run(main())


def test_password_entry_matches_mosquitto_passwd() -> None:
    salt_b64 = MOSQUITTO_PASSWD_LINE.split("$")[3]
    assert password_entry("u1", "secret", base64.b64decode(salt_b64)) == MOSQUITTO_PASSWD_LINE
    assert password_entry("u1", "other", base64.b64decode(salt_b64)) != MOSQUITTO_PASSWD_LINE
    with pytest.raises(ValueError):
        password_entry("a:b", "x")


def test_connect_packet_flags() -> None:
    first, body = read_packet(
        connect_packet(
            "node-1",
            username="node-1",
            password="pw",
            will=Will("ftd/v1/nodes/node-1/status", b"{}"),
            keepalive_s=5,
            clean_session=False,
        )
    )
    assert first == 0x10
    assert body[:6] == b"\x00\x04MQTT" and body[6] == 4
    # username, password, will retain, will QoS 1, will flag; no clean session
    assert body[7] == 0x80 | 0x40 | 0x20 | 0x08 | 0x04
    assert struct.unpack("!H", body[8:10])[0] == 5
    assert body.endswith(b"\x00\x06node-1\x00\x02pw")


def test_subscribe_packet_asks_qos1_for_each_filter() -> None:
    first, body = read_packet(subscribe_packet(["a/b", "c"], 7))
    assert first == 0x82
    assert body == b"\x00\x07" + b"\x00\x03a/b\x01" + b"\x00\x01c\x01"


@settings(max_examples=examples(200))
@given(
    topic=st.text(min_size=1, max_size=300).filter(lambda t: "\x00" not in t),
    payload=st.binary(max_size=40_000),
    packet_id=st.integers(1, 65535),
    retain=st.booleans(),
)
def test_publish_packet_round_trips(topic: str, payload: bytes, packet_id: int, retain: bool) -> None:
    first, body = read_packet(publish_packet(topic, payload, packet_id, retain=retain))
    assert first == 0x30 | 0x02 | (0x01 if retain else 0)
    (length,) = struct.unpack("!H", body[:2])
    assert body[2 : 2 + length].decode() == topic
    assert struct.unpack("!H", body[2 + length : 4 + length])[0] == packet_id
    assert body[4 + length :] == payload


def test_layout_puts_half_the_jobs_in_the_rack() -> None:
    plan = layout(200, 50, 10, 4)
    assert len(plan["nodes"]) == 201 and plan["probe"] in plan["nodes"]
    assert plan["rack"] == [f"node-{i:05d}" for i in range(50)]
    rack = set(plan["rack"])
    in_rack = [job for job, nodes in plan["jobs"].items() if rack & set(nodes)]
    assert in_rack == plan["jobs_in_rack"] and len(in_rack) == 5
    straddling = [job for job in in_rack if not set(plan["jobs"][job]) <= rack]
    assert len(straddling) == 1
    with pytest.raises(ValueError):
        layout(30, 25, 10, 4)


def test_the_storm_counts_the_racks_nodes_once_each_and_no_other() -> None:
    from ftd.bench.scale_coordinator import RackTally

    tally = RackTally(["node-00000", "node-00001"])
    tally.decided("node-00000", 10.0)
    tally.decided("node-00000", 11.0)  # decided again (a second Last Will): still one node
    tally.decided("node-09999", 12.0)  # not in the rack: never one of the storm's decisions
    tally.decided("probe-node", 13.0)
    assert tally.rack_decided == {"node-00000"} and tally.others == 2 and tally.last == 11.0
    tally.decided("node-00001", 14.0)
    assert len(tally.rack_decided) == 2 and tally.last == 14.0
