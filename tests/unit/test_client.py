"""The trainer client against a real LocalApi (same process: the client's own thread does its I/O)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftd.agent.local_api import LocalApi
from ftd.client import Client
from ftd.events import Directive
from tests.unit.helpers import Recorder, until

REPO = Path(__file__).resolve().parents[2]


def directive(id: str, action: str = "save", job: str | None = "j1", **kw: object) -> Directive:
    return Directive(id=id, ts=time.time(), action=action, job=job, **kw)  # type: ignore[arg-type]


@pytest.fixture
def clients() -> Iterator[list[Client]]:
    made: list[Client] = []
    yield made
    for client in made:
        client.close()


async def connected(clients: list[Client], api: LocalApi, job: str = "j1", rank: int = 0) -> Client:
    client = Client(job=job, rank=rank, local_rank=rank, socket_path=api.socket_path)
    clients.append(client)
    await until(lambda: client.connected)
    return client


def test_without_an_agent_every_call_is_quick_and_false(sockdir: str) -> None:
    start = time.monotonic()
    with Client(job="j1", rank=0, socket_path=os.path.join(sockdir, "absent.sock")) as client:
        for step in range(1000):
            client.heartbeat(step)
            assert not client.should_save()
            assert not client.should_stop()
        client.ack_saved(1000, "/x")
        client.nack("nothing to nack")
        assert client.wait(0.05) is None
        assert client.pending_directive is None
        assert not client.connected
    assert time.monotonic() - start < 2.0


def test_without_a_socket_directory_or_with_an_impossible_path(tmp_path: Path) -> None:
    long_path = str(tmp_path / ("x" * 200) / "agent.sock")  # longer than sun_path allows
    with Client(job="j1", socket_path=long_path) as client:
        client.heartbeat(1)
        assert client.wait(0.05) is None
        assert not client.should_save()


def test_defaults_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FTD_JOB", "TORCHELASTIC_RUN_ID", "RANK", "LOCAL_RANK", "FTD_SOCKET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    client = Client(connect=False)
    assert (client.job, client.rank, client.local_rank, client.socket_path) == (
        "777",
        5,
        1,
        "/run/ftd/agent.sock",
    )
    monkeypatch.setenv("FTD_JOB", "jx")
    monkeypatch.setenv("RANK", "9")
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setenv("FTD_SOCKET", "/tmp/s.sock")
    client = Client(connect=False)
    assert (client.job, client.rank, client.local_rank, client.socket_path) == ("jx", 9, 2, "/tmp/s.sock")
    monkeypatch.setenv("RANK", "not-a-number")
    assert Client(connect=False, rank=None).rank == 5  # falls through to SLURM_PROCID, never raises
    assert Client(job="explicit", rank=3, connect=False).job == "explicit"


async def test_register_save_ack_round_trip(api: LocalApi, rec: Recorder, clients: list[Client]) -> None:
    client = await connected(clients, api, rank=2)
    await until(lambda: any(r.rank == 2 for _, ranks in rec.presence for r in ranks))
    assert rec.presence[0][0] == "j1"
    assert rec.presence[0][1][0].pid == os.getpid()
    assert not client.should_save()
    assert await api.deliver(directive("d1", reason="xid 79 on gpu 3")) == 1
    assert await asyncio.to_thread(client.wait, 5) == "save"
    assert client.should_save()
    assert not client.should_stop()
    info = client.pending_directive
    assert info is not None
    assert (info.id, info.action, info.reason) == ("d1", "save", "xid 79 on gpu 3")
    assert client.last_directive_ns is not None
    client.ack_saved(1200, "/ckpt/1200")
    assert not client.should_save()
    await until(lambda: len(rec.acks) == 1)
    ack = rec.acks[0]
    assert (ack.directive_id, ack.job, ack.rank, ack.node, ack.ok, ack.step, ack.path) == (
        "d1",
        "j1",
        2,
        "node1",
        True,
        1200,
        "/ckpt/1200",
    )
    assert await asyncio.to_thread(client.wait, 0.1) is None


async def test_nack_reports_failure_and_clears_the_flag(
    api: LocalApi, rec: Recorder, clients: list[Client]
) -> None:
    client = await connected(clients, api)
    await api.deliver(directive("d1"))
    assert await asyncio.to_thread(client.wait, 5) == "save"
    client.nack("disk full")
    assert not client.should_save()
    await until(lambda: len(rec.acks) == 1)
    assert (rec.acks[0].ok, rec.acks[0].reason) == (False, "disk full")


async def test_stop_is_sticky_and_acknowledged_on_close(
    api: LocalApi, rec: Recorder, clients: list[Client]
) -> None:
    client = await connected(clients, api)
    await api.deliver(directive("s1", action="stop"))
    assert await asyncio.to_thread(client.wait, 5) == "stop"
    assert client.should_stop()
    client.heartbeat(10)
    client.ack_saved(10)  # acks saves, not the stop
    assert client.should_stop()
    assert client.pending_directive is not None
    await asyncio.to_thread(client.close)
    await until(lambda: len(rec.acks) == 1)
    assert (rec.acks[0].directive_id, rec.acks[0].reason) == ("s1", "exiting")
    assert client.should_stop()


async def test_save_then_stop_wait_reports_save_first(api: LocalApi, clients: list[Client]) -> None:
    client = await connected(clients, api)
    await api.deliver(directive("s1", action="save"))
    await api.deliver(directive("s2", action="stop"))
    await until(lambda: client.should_stop())
    assert await asyncio.to_thread(client.wait, 1) == "save"
    client.ack_saved(1)
    assert await asyncio.to_thread(client.wait, 1) == "stop"


async def test_directive_for_another_job_is_ignored(api: LocalApi, clients: list[Client]) -> None:
    a = await connected(clients, api, job="jA")
    b = await connected(clients, api, job="jB")
    assert await api.deliver(directive("d1", job="jB")) == 1
    assert await asyncio.to_thread(b.wait, 5) == "save"
    assert await asyncio.to_thread(a.wait, 0.3) is None
    assert not a.should_save()
    # and a directive for the whole node reaches both
    assert await api.deliver(directive("d2", job=None, action="stop")) == 2
    await until(lambda: a.should_stop() and b.should_stop())


async def test_duplicate_directive_is_not_seen_twice(api: LocalApi, clients: list[Client]) -> None:
    client = await connected(clients, api)
    await api.deliver(directive("d1"))
    assert await asyncio.to_thread(client.wait, 5) == "save"
    client.ack_saved(1)
    assert await api.deliver(directive("d1")) == 0
    assert await asyncio.to_thread(client.wait, 0.3) is None
    assert not client.should_save()


async def test_reconnect_after_agent_restart_gets_the_pending_directive(
    api: LocalApi, rec: Recorder, clients: list[Client]
) -> None:
    client = await connected(clients, api)
    await api.stop()
    await until(lambda: not client.connected)
    assert await api.deliver(directive("d1")) == 0  # arrives while the socket is down
    await api.start()
    await until(lambda: client.connected)
    assert await asyncio.to_thread(client.wait, 5) == "save"
    client.ack_saved(42, "/ck")
    await until(lambda: len(rec.acks) == 1)
    assert rec.acks[0].step == 42


async def test_ack_sent_while_disconnected_is_delivered_after_reconnect(
    api: LocalApi, rec: Recorder, clients: list[Client]
) -> None:
    client = await connected(clients, api)
    await api.deliver(directive("d1"))
    assert await asyncio.to_thread(client.wait, 5) == "save"
    await api.stop()
    await until(lambda: not client.connected)
    client.ack_saved(7)
    await api.start()
    await until(lambda: len(rec.acks) == 1)
    assert (rec.acks[0].directive_id, rec.acks[0].step) == ("d1", 7)
    assert await asyncio.to_thread(client.wait, 0.3) is None  # acked: the agent does not resend it


async def test_heartbeats_follow_the_training_loop(api: LocalApi, clients: list[Client]) -> None:
    client = await connected(clients, api)
    for step in range(50):  # a live loop: beats for ~1 s
        client.heartbeat(step)
        await asyncio.sleep(0.02)
    assert api.ranks_silent_for(0.6) == []
    beats = api.counters["heartbeats"]
    assert 2 <= beats <= 15  # forwarded every ~0.2 s, not once per step
    await until(lambda: api.jobs()["j1"][0].step == 49)  # the last beat goes out within ~0.2 s
    await asyncio.sleep(1.0)  # the loop hangs: no heartbeat() calls
    silent = api.ranks_silent_for(0.6)
    assert [(job, r.rank) for job, r in silent] == [("j1", 0)]
    assert api.counters["heartbeats"] <= beats + 1
    client.heartbeat(50)  # it recovers
    await until(lambda: api.ranks_silent_for(0.6) == [])


async def test_garbage_from_another_connection_does_not_disturb_a_client(
    api: LocalApi, clients: list[Client]
) -> None:
    client = await connected(clients, api)
    _, writer = await asyncio.open_unix_connection(api.socket_path)
    writer.write(b"garbage\n" + b"\x00" * 200_000 + b"\n" + b'{"op":"ack"}\n')
    await writer.drain()
    await until(lambda: api.counters["bad_messages"] >= 3)
    await api.deliver(directive("d1"))
    assert await asyncio.to_thread(client.wait, 5) == "save"
    writer.close()
    await writer.wait_closed()


async def test_client_survives_garbage_from_the_agent(sockdir: str, clients: list[Client]) -> None:
    path = os.path.join(sockdir, "fake.sock")

    async def fake_agent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b'{"op":"ok","re":"register"}\nnot json\n[1]\n{"op":"directive"}\n')
        writer.write(b'{"op":"directive","id":"x","action":"gpu_reset"}\n')
        writer.write(b'{"op":"directive","id":"o1","action":"stop","job":"other-job"}\n')
        writer.write(b'{"op":"directive","id":"d1","action":"save","job":"j1"}\n')
        await writer.drain()
        await reader.read()  # until the client hangs up
        writer.close()

    server = await asyncio.start_unix_server(fake_agent, path=path)
    client = Client(job="j1", socket_path=path)
    try:
        assert await asyncio.to_thread(client.wait, 5) == "save"
        assert client.pending_directive is not None
        assert client.pending_directive.id == "d1"
        assert not client.should_stop()  # the stop was for another job: the client filters too
    finally:
        await asyncio.to_thread(client.close)
        await asyncio.sleep(0.1)  # let the fake agent see EOF and close its side
        server.close()
        await server.wait_closed()


def test_import_is_stdlib_only() -> None:
    code = (
        "import sys, ftd.client; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('msgspec','structlog','aiomqtt','amqtt','pluggy') or m in ('ftd.events','ftd.logs')); "
        "print(bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout.strip()
    assert out == "[]"


def test_bench_client_reports_cost_well_under_budget() -> None:
    from ftd.bench.client import bench_client

    result = bench_client(steps=20_000, latency_samples=10)
    assert result["us_per_step"] < 20.0  # the budget; measured values are ~0.2 µs
    assert result["us_per_step_connected"] > 0
    assert result["acks_received"] == 10
