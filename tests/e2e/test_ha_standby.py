"""A standby replica (ftd.coordinator.ha.HaRunner while another holds the lease): it tells systemd it
is ready and keeps pinging the watchdog, never opens the coordinator's bus session, and reports who
leads. Real PostgreSQL; systemd's notify socket is a datagram socket of the test."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from ftd.bench.failover import _config
from ftd.bus.base import Bus
from ftd.config import load_config
from ftd.coordinator.ha import HaRunner
from ftd.coordinator.lease import Lease
from tests.realparts import start_postgres

pytestmark = pytest.mark.timeout(120)


async def test_standby_is_ready_pings_the_watchdog_and_holds_no_bus_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pg = start_postgres(tmp_path / "pg")
    try:
        leader = Lease(pg.dsn, "coord-a", ttl_s=30.0)
        assert leader.try_acquire()
        config_path = tmp_path / "coordinator.toml"
        _config(config_path, "coord-b", 1, pg.dsn)  # bus port 1: it must never be used
        config = load_config(config_path)
        sock_path = str(tmp_path / "notify.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        listener.bind(sock_path)
        listener.setblocking(False)
        monkeypatch.setenv("NOTIFY_SOCKET", sock_path)
        monkeypatch.setenv("WATCHDOG_USEC", "200000")  # pings every 0.1 s
        buses: list[str] = []

        def make_bus() -> Bus:
            buses.append("coordinator")
            raise AssertionError("a standby opened the coordinator's bus")

        runner = HaRunner(config, make_bus=make_bus, scheduler=None)
        task = asyncio.create_task(runner.run())
        messages: list[bytes] = []
        for _ in range(40):
            await asyncio.sleep(0.05)
            while True:
                try:
                    messages.append(listener.recv(256))
                except BlockingIOError:
                    break
        runner._refresh()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        listener.close()
        assert messages[0] == b"READY=1"
        assert messages.count(b"WATCHDOG=1") >= 5
        assert buses == []
        assert runner.status.role == "standby"
        assert (runner.status.leader, runner.status.leader_epoch) == ("coord-a", 1)
        assert runner.status.as_dict()["role"] == "standby"
        leader.close()
    finally:
        pg.remove()
