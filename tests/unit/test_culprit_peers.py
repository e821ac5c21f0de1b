"""Peer naming: the address a communication error blames, and the node that owns it."""

from __future__ import annotations

import ipaddress

from hypothesis import given, settings
from hypothesis import strategies as hs

from ftd.culprit.peers import normalize_address, parse_peer_error, resolve_peer
from tests.properties import examples

# what torch 2.13's gloo printed here when the other rank died (its pid, our wording of the rest kept)
GLOO_REAL = (
    "[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
    "Connection closed by peer [127.0.0.1]:15243. This is typically caused by a remote worker crashing."
)


def test_lines_that_name_a_peer() -> None:
    cases = {
        GLOO_REAL: "127.0.0.1",
        "Read error [10.1.2.3]:40001: Connection reset by peer": "10.1.2.3",
        "gloo: Connect timeout [10.1.2.4]:23456": "10.1.2.4",
        "n1:77:88 [0] misc/socket.cc:484 NCCL WARN Connect to 10.0.0.2<43210> failed : Connection refused": (
            "10.0.0.2"
        ),
        "NCCL WARN socketProgressOpt: Call to recv from 10.0.0.7<58744> failed : Connection reset by peer": (
            "10.0.0.7"
        ),
        "NCCL WARN NET/Socket : peer 192.168.4.9<55678> closed connection": "192.168.4.9",
        "Connection closed by remote peer node-2.cluster.local<35291>": "node-2.cluster.local",
        "Connect to [fe80::1%ib0]:29500 failed": "fe80::1",
        "Connection closed by peer [::ffff:10.0.0.9]:1234": "10.0.0.9",
        "Connect to Node-3:29500 failed": "node-3",
    }
    for line, address in cases.items():
        assert parse_peer_error(line) == address, line


def test_lines_that_name_nobody() -> None:
    for line in (
        "RuntimeError: Connection reset by peer",
        "NCCL WARN Cuda failure 'out of memory'",
        "step 12 loss 0.1",
        "Connect timeout [none]",
        "",
    ):
        assert parse_peer_error(line) is None, line


def test_resolve_to_the_node_that_owns_the_address() -> None:
    addresses = {"10.0.0.2": "node-2", "node-2": "node-2", "fe80::1": "node-5", "10.0.0.3": "node-3"}
    assert resolve_peer("10.0.0.2", addresses) == "node-2"
    assert resolve_peer("node-2.cluster.local", addresses) == "node-2"
    assert resolve_peer("NODE-2", addresses) == "node-2"
    assert resolve_peer("fe80:0:0::1", addresses) == "node-5"
    assert resolve_peer("::ffff:10.0.0.3", addresses) == "node-3"
    assert resolve_peer("10.0.0.99", addresses) is None
    assert resolve_peer("127.0.0.1", addresses) is None  # nobody announces loopback
    assert resolve_peer("", addresses) is None
    assert resolve_peer("10.0.0.2.evil", addresses) is None


@settings(max_examples=examples(300))
@given(hs.ip_addresses(v=4), hs.integers(1, 65535), hs.sampled_from(["gloo", "nccl", "remote"]))
def test_any_ipv4_peer_is_named(ip: ipaddress.IPv4Address, port: int, shape: str) -> None:
    line = {
        "gloo": f"Connection closed by peer [{ip}]:{port}. This is typically caused by a remote worker",
        "nccl": f"NCCL WARN Connect to {ip}<{port}> failed : Connection timed out",
        "remote": f"Connection closed by remote peer {ip}<{port}>",
    }[shape]
    assert parse_peer_error(line) == str(ip)
    assert resolve_peer(str(ip), {str(ip): "n"}) == "n"


@settings(max_examples=examples(400))
@given(hs.text(max_size=300))
def test_arbitrary_text_never_raises(line: str) -> None:
    address = parse_peer_error(line)
    if address is not None:
        assert address and address == normalize_address(address)
        resolve_peer(address, {address: "n"})
    resolve_peer(line, {line: "n", "x": "y"})
