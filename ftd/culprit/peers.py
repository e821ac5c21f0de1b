"""Peer naming: a communication error one rank prints often names the *other* end by address; that
address, resolved to the node that owns it, is evidence against that node, not against the rank that
printed it.

The shapes recognised (the address is taken without its port):

* gloo (torch's CPU backend): ``Connection closed by peer [10.0.0.2]:23456`` when the other process
  died, ``Read error [10.0.0.2]:23456: Connection reset by peer``, ``Connect timeout [10.0.0.2]:23456``;
* NCCL's socket layer: ``Connect to 10.0.0.2<43210> failed``, ``Call to recv from 10.0.0.2<43210>
  failed``, ``peer 10.0.0.2<43210> closed connection`` / ``Connection closed by remote peer
  node-2<43210>``;
* the generic ``Connect to HOST:PORT failed``.

Addresses are IPv4, IPv6 (bracketed or bare, ``%zone`` dropped; ``::ffff:a.b.c.d`` is read as
``a.b.c.d``) or host names. :func:`resolve_peer` maps one to a node through the addresses each agent
announced for its node.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping

MAX_LINE = 4096  # characters of a log line looked at

_HOST = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
_V4 = r"\d{1,3}(?:\.\d{1,3}){3}"
_V6 = r"[0-9A-Fa-f:]*:[0-9A-Fa-f:.]*(?:%[A-Za-z0-9_.-]+)?"
_ADDR = rf"(?:\[(?P<b>{_V6}|{_V4}|{_HOST})\]|(?P<a>{_V4}|{_V6}|{_HOST}))"
_PORT = r"(?:<\d{1,5}>|:\d{1,5})?"

_PATTERNS = tuple(
    re.compile(p)
    for p in (
        rf"Connection closed by (?:remote )?peer {_ADDR}{_PORT}",
        rf"Read error {_ADDR}{_PORT}",
        rf"Write error {_ADDR}{_PORT}",
        rf"Connect timeout {_ADDR}{_PORT}",
        rf"Connect to {_ADDR}{_PORT} failed",
        rf"Call to (?:recv|send|connect) (?:from|to) {_ADDR}{_PORT} failed",
        rf"\bpeer {_ADDR}{_PORT} closed connection",
        rf"Connection reset by peer {_ADDR}{_PORT}",
    )
)


def normalize_address(address: str) -> str:
    """The form addresses are compared in: no brackets or zone, IPv4-mapped IPv6 as IPv4, IPv6
    compressed, host names in lower case."""
    text = address.strip().strip("[]").split("%", 1)[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return text.lower().rstrip(".")
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def parse_peer_error(line: str) -> str | None:
    """The address a communication error line blames (normalised, no port), None when it names none."""
    if not isinstance(line, str):
        return None
    text = line[:MAX_LINE]
    for pattern in _PATTERNS:
        match = pattern.search(text)
        if match is None:
            continue
        address = match.group("b") or match.group("a")
        if not address or address in {"none", "unknown"}:
            continue
        normal = normalize_address(address)
        if normal and normal.strip(":."):
            return normal
    return None


def resolve_peer(address: str, addresses: Mapping[str, str], *, normalized: bool = False) -> str | None:
    """The node that owns ``address``, given each node's addresses (IPs and host names -> node); a
    fully-qualified name also matches its short name (``node-2.cluster`` -> ``node-2``). A loopback
    address resolves only where a node announced it (agents announce none: every node has them).
    ``normalized``: the keys are :func:`normalize_address`'s already (a book kept that way), so no
    table is rebuilt per call."""
    if not isinstance(address, str) or not address:
        return None
    wanted = normalize_address(address)
    table = addresses if normalized else {normalize_address(key): node for key, node in addresses.items()}
    node = table.get(wanted)
    if node is None and "." in wanted and not _is_ip(wanted):
        node = table.get(wanted.split(".", 1)[0])
    return node


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
