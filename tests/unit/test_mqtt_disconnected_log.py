"""A bus that cannot reach its broker says so again and again, ever less often: the 1st, 2nd, 4th, 8th
failed attempt at warning level, the others at debug. (The coordinator of a failed CI run said it once,
then nothing for 110 s.)"""

from __future__ import annotations

import socket

from structlog.testing import capture_logs

from ftd.bus.mqtt import MqttBus
from tests.unit.helpers import until


def closed_port() -> int:
    """A loopback port nothing listens on: connections to it are refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_repeated_connect_failures_warn_at_powers_of_two() -> None:
    bus = MqttBus(
        host="127.0.0.1", port=closed_port(), client_id="lonely", reconnect_min_s=0.001, reconnect_max_s=0.001
    )
    with capture_logs() as logs:
        await bus.start()
        await until(lambda: sum(e["event"] == "bus_disconnected" for e in logs) >= 12, within=30)
        await bus.stop()
    failures = [e for e in logs if e["event"] == "bus_disconnected"][:12]
    assert [e["attempt"] for e in failures] == list(range(1, 13))
    warned = [e["attempt"] for e in failures if e["log_level"] == "warning"]
    assert warned == [1, 2, 4, 8]
    assert bus.connects == 0
