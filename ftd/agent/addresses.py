"""This node's addresses, announced in its status so the coordinator can name it from another node's
error (issue #33: "Connection closed by peer [10.0.0.2]" blames the node that owns 10.0.0.2).

What: ``agent.addresses`` when the operator lists them; else discovered with the standard library only:
the host name and its short form, the IPv4 address of every interface (``SIOCGIFADDR``) and every IPv6
address in ``/proc/net/if_inet6``. Loopback and link-local addresses are left out (every node has the
same ones), and so is anything that fails: discovery never raises and never waits on DNS.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import socket
import struct
from collections.abc import Iterable

from ftd.config import AgentConfig

MAX_ADDRESSES = 64  # an announcement is small; a node with more interfaces names the first 64

_SIOCGIFADDR = 0x8915
_IF_INET6 = "/proc/net/if_inet6"


def _useful(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return bool(address) and address not in {"localhost", "localhost.localdomain"}
    return not (ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast)


def _ipv4_of_interfaces() -> list[str]:
    found: list[str] = []
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            with contextlib.suppress(OSError):
                packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
                found.append(socket.inet_ntoa(packed[20:24]))
    return found


def _ipv6_of_interfaces(path: str = _IF_INET6) -> list[str]:
    found: list[str] = []
    with contextlib.suppress(OSError, ValueError), open(path, encoding="ascii", errors="replace") as f:
        for line in f:
            fields = line.split()
            if fields and len(fields[0]) == 32:
                with contextlib.suppress(ValueError):
                    found.append(str(ipaddress.IPv6Address(bytes.fromhex(fields[0]))))
    return found


def _unique(items: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for item in items:
        if item and _useful(item):
            seen.setdefault(item, None)
    return list(seen)[:MAX_ADDRESSES]


def discover() -> list[str]:
    """The host name (full and short) and the interfaces' non-loopback, non-link-local addresses."""
    host = ""
    with contextlib.suppress(OSError):
        host = socket.gethostname()
    names = [host.lower(), host.split(".", 1)[0].lower()] if host else []
    return _unique([*names, *_ipv4_of_interfaces(), *_ipv6_of_interfaces()])


def node_addresses(cfg: AgentConfig) -> list[str]:
    """What the agent announces: ``agent.addresses`` as configured (loopback allowed there, for test
    set-ups that give each node its own 127.0.0.x), else :func:`discover`."""
    if cfg.addresses is not None:
        return list(dict.fromkeys(cfg.addresses))[:MAX_ADDRESSES]
    return discover()


def interface_with(address: str) -> str | None:
    """The name of the interface that holds the IPv4 ``address`` (``SIOCGIFADDR`` over every
    interface), or None: not IPv4, no such interface, or the lookup failed. A pair test's all-reduce
    step pins gloo to it (``GLOO_SOCKET_IFNAME``), so the collective crosses the link the test measured."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            with contextlib.suppress(OSError):
                packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
                if socket.inet_ntoa(packed[20:24]) == address:
                    return name
    return None
