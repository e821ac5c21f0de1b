"""systemd notification (READY=1, WATCHDOG=1, STATUS=...) without a dependency.

The protocol is one datagram to the unix socket named by ``$NOTIFY_SOCKET`` (a leading ``@`` means
the abstract namespace). Outside systemd the variable is unset and every call is a no-op.

The send never waits: the daemons call :func:`notify` on their event loop, and a datagram socket whose
reader has fallen behind (its queue full) would otherwise block the whole loop -- the API, the bus,
the lease -- until the reader catches up. Such a message is dropped (``False``); the next watchdog
ping is sent a moment later anyway.
"""

from __future__ import annotations

import asyncio
import os
import socket


def notify(message: str) -> bool:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)  # a full queue: drop this message rather than stall the loop
            sock.sendto(message.encode(), address)
    except OSError:
        return False
    return True


def watchdog_interval_s() -> float | None:
    """Half the watchdog timeout systemd asked for (``$WATCHDOG_USEC``), or None when there is none."""
    usec = os.environ.get("WATCHDOG_USEC")
    if not usec or not usec.isdecimal() or int(usec) == 0:
        return None
    return int(usec) / 2_000_000


async def ping_watchdog() -> None:
    """``WATCHDOG=1`` every :func:`watchdog_interval_s` until cancelled; returns at once when systemd
    asked for no watchdog (a daemon whose liveness is its event loop running)."""
    interval = watchdog_interval_s()
    if interval is None:
        return
    while True:
        notify("WATCHDOG=1")
        await asyncio.sleep(interval)
