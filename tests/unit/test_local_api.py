"""LocalApi over real unix sockets, driven by raw protocol lines (the client has its own tests)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import time
from typing import Any

import pytest

from ftd.agent.local_api import MAX_LINE, LocalApi
from ftd.agent.local_api import presence as local_api_presence
from ftd.events import Directive
from tests.unit.helpers import Recorder, until


def exists(path: str) -> bool:
    return os.path.exists(path)


def write_text(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def read_text(path: str) -> str:
    with open(path) as f:
        return f.read()


class Peer:
    """A raw protocol client."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, api: LocalApi) -> Peer:
        reader, writer = await asyncio.open_unix_connection(api.socket_path, limit=1 << 20)
        return cls(reader, writer)

    async def send(self, obj: dict[str, Any] | bytes) -> None:
        self.writer.write(obj if isinstance(obj, bytes) else json.dumps(obj).encode() + b"\n")
        await self.writer.drain()

    async def recv(self, within: float = 5.0) -> dict[str, Any]:
        line = await asyncio.wait_for(self.reader.readline(), within)
        assert line, "connection closed"
        result: dict[str, Any] = json.loads(line)
        return result

    async def nothing_within(self, seconds: float) -> bool:
        try:
            line = await asyncio.wait_for(self.reader.readline(), seconds)
        except TimeoutError:
            return True
        raise AssertionError(f"unexpected message: {line!r}")

    async def register(self, job: str, rank: int, **extra: Any) -> dict[str, Any]:
        await self.send({"v": 1, "op": "register", "job": job, "rank": rank, **extra})
        return await self.recv()

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


def directive(id: str, action: str = "save", job: str | None = "j1", **kw: Any) -> Directive:
    return Directive(id=id, ts=time.time(), action=action, job=job, **kw)  # type: ignore[arg-type]


async def test_start_creates_dir_sets_mode_and_replaces_stale_socket(sockdir: str, rec: Recorder) -> None:
    path = os.path.join(sockdir, "sub", "a.sock")
    os.makedirs(os.path.dirname(path))
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)  # bound but never listening: what a crashed agent leaves behind
    stale.close()
    server = LocalApi(path, "n", rec.on_presence, rec.on_ack)
    await server.start()
    try:
        st = os.stat(path)
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o660
        peer = await Peer.open(server)
        assert (await peer.register("j1", 0))["op"] == "ok"
        await peer.close()
    finally:
        await server.stop()
    assert not exists(path)


async def test_start_refuses_a_live_socket_and_a_regular_file(
    api: LocalApi, sockdir: str, rec: Recorder
) -> None:
    second = LocalApi(api.socket_path, "n", rec.on_presence, rec.on_ack)
    with pytest.raises(RuntimeError, match="already listening"):
        await second.start()
    regular = os.path.join(sockdir, "file")
    write_text(regular, "keep me")
    third = LocalApi(regular, "n", rec.on_presence, rec.on_ack)
    with pytest.raises(RuntimeError, match="not a socket"):
        await third.start()
    assert read_text(regular) == "keep me"


async def test_register_and_disconnect_report_presence(api: LocalApi, rec: Recorder) -> None:
    a = await Peer.open(api)
    b = await Peer.open(api)
    assert await a.register("j1", 0, local_rank=0, pid=11) == {"v": 1, "op": "ok", "re": "register"}
    assert (await b.register("j1", 1, local_rank=1, pid=12))["op"] == "ok"
    await until(lambda: len(rec.presence) == 2)
    job, ranks = rec.presence[-1]
    assert job == "j1"
    assert [(r.rank, r.local_rank, r.pid) for r in ranks] == [(0, 0, 11), (1, 1, 12)]
    assert [r.rank for r in api.jobs()["j1"]] == [0, 1]
    await a.close()
    await until(lambda: len(rec.presence) == 3)
    assert [r.rank for r in rec.presence[-1][1]] == [1]
    await b.close()
    await until(lambda: len(rec.presence) == 4)
    assert rec.presence[-1] == ("j1", [])
    assert api.jobs() == {}


async def test_ack_becomes_an_event_ack(api: LocalApi, rec: Recorder) -> None:
    peer = await Peer.open(api)
    await peer.register("j1", 3)
    await peer.send(
        {"v": 1, "op": "ack", "directive_id": "d1", "ok": True, "step": 120, "path": "/ck/120", "reason": ""}
    )
    await until(lambda: len(rec.acks) == 1)
    ack = rec.acks[0]
    assert (ack.directive_id, ack.job, ack.rank, ack.node) == ("d1", "j1", 3, "node1")
    assert (ack.ok, ack.step, ack.path) == (True, 120, "/ck/120")
    assert ack.ts == pytest.approx(time.time(), abs=60)
    await peer.close()


async def test_deliver_reaches_the_job_and_only_the_job(api: LocalApi) -> None:
    a, b = await Peer.open(api), await Peer.open(api)
    await a.register("jA", 0)
    await b.register("jB", 0)
    assert await api.deliver(directive("d1", job="jA", reason="xid 79")) == 1
    msg = await a.recv()
    assert (msg["op"], msg["v"], msg["id"], msg["action"], msg["job"], msg["reason"]) == (
        "directive",
        1,
        "d1",
        "save",
        "jA",
        "xid 79",
    )
    assert await b.nothing_within(0.2)
    # job None: every job on the node
    assert await api.deliver(directive("d2", action="stop", job=None)) == 2
    assert (await a.recv())["id"] == "d2"
    assert (await b.recv())["id"] == "d2"
    await a.close()
    await b.close()


async def test_duplicate_directive_is_not_redelivered(api: LocalApi) -> None:
    peer = await Peer.open(api)
    await peer.register("j1", 0)
    assert await api.deliver(directive("d1")) == 1
    assert (await peer.recv())["id"] == "d1"
    assert await api.deliver(directive("d1")) == 0
    assert await peer.nothing_within(0.2)
    # ... nor to a rank that registers later, beyond the one pending copy
    late = await Peer.open(api)
    await late.register("j1", 1)
    assert (await late.recv())["id"] == "d1"
    assert await late.nothing_within(0.2)
    assert api.counters["duplicate_directives"] == 1
    await peer.close()
    await late.close()


async def test_pending_directive_reaches_late_ranks_until_answered_or_expired(api: LocalApi) -> None:
    assert await api.deliver(directive("d1")) == 0  # nobody connected yet
    assert await api.deliver(directive("old", deadline_s=0.05)) == 0
    await asyncio.sleep(0.1)
    r0 = await Peer.open(api)
    await r0.register("j1", 0)
    assert (await r0.recv())["id"] == "d1"  # "old" expired before anyone came
    assert await r0.nothing_within(0.2)
    await r0.send({"v": 1, "op": "ack", "directive_id": "d1", "step": 5})
    await asyncio.sleep(0.05)
    await r0.close()
    # rank 0 answered d1 and it was the only rank d1 reached: d1 is done
    assert api.pending() == []
    again = await Peer.open(api)
    await again.register("j1", 0)
    assert await again.nothing_within(0.2)
    await again.close()


async def test_reconnecting_rank_gets_unanswered_directive_again(api: LocalApi) -> None:
    r0, r1 = await Peer.open(api), await Peer.open(api)
    await r0.register("j1", 0)
    await r1.register("j1", 1)
    await api.deliver(directive("d1"))
    assert (await r0.recv())["id"] == "d1"
    assert (await r1.recv())["id"] == "d1"
    await r0.send({"v": 1, "op": "ack", "directive_id": "d1", "step": 1})
    await r0.close()
    await r1.close()  # rank 1 never answered
    r0b, r1b = await Peer.open(api), await Peer.open(api)
    await r0b.register("j1", 0)
    await r1b.register("j1", 1)
    assert (await r1b.recv())["id"] == "d1"
    assert await r0b.nothing_within(0.2)
    await r0b.close()
    await r1b.close()


async def test_bad_input_is_answered_counted_and_harmless(api: LocalApi, rec: Recorder) -> None:
    good = await Peer.open(api)
    await good.register("j1", 0)
    bad = await Peer.open(api)
    cases: list[tuple[bytes, str | None]] = [
        (b"this is not json\n", None),
        (b"[1, 2, 3]\n", None),
        (b'{"v":1,"op":"explode"}\n', "explode"),
        (b'{"v":1,"op":"register","job":"j1","rank":"zero"}\n', "register"),
        (b'{"v":1,"op":"register","job":"a/b","rank":0}\n', "register"),
        (b'{"v":1,"op":"register","job":"j1","rank":-1}\n', "register"),
        (b'{"v":2,"op":"register","job":"j1","rank":0}\n', "register"),
        (b'{"v":1,"op":"heartbeat","step":1}\n', "heartbeat"),  # before register
        (b'{"v":1,"op":"ack","directive_id":"x"}\n', "ack"),  # before register
        (b"\xff\xfe\n", None),
        (b"x" * (MAX_LINE + 10) + b"\n", None),
        (b'{"op":"register","job":"' + b"y" * (3 * MAX_LINE) + b'","rank":0}\n', None),
    ]
    for line, re in cases:
        await bad.send(line)
        reply = await bad.recv()
        assert reply["op"] == "error", line[:60]
        assert reply["re"] == re, line[:60]
        assert reply["error"]
    assert api.counters["bad_messages"] == len(cases)
    # the same connection still works, and so does everyone else
    assert (await bad.register("j1", 1))["op"] == "ok"
    await bad.send(b'{"v":1,"op":"heartbeat","step":"ten"}\n')
    assert (await bad.recv())["re"] == "heartbeat"
    assert await api.deliver(directive("d1")) == 2
    assert (await good.recv())["id"] == "d1"
    assert (await bad.recv())["id"] == "d1"
    assert sorted(r.rank for r in api.jobs()["j1"]) == [0, 1]
    await good.close()
    await bad.close()


async def test_second_register_on_one_connection_is_refused(api: LocalApi) -> None:
    peer = await Peer.open(api)
    await peer.register("j1", 0)
    reply = await peer.register("j2", 0)
    assert (reply["op"], reply["re"]) == ("error", "register")
    assert list(api.jobs()) == ["j1"]
    await peer.close()


async def test_step_progress_reports_presence_at_most_once_per_second(
    api: LocalApi, rec: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The throttle's interval (1 s) at half scale, every duration below with it: the same ratios
    # (2.5 intervals of progress, 1.3 of quiet) in half the time.
    interval = 0.5
    monkeypatch.setattr(local_api_presence, "PRESENCE_MIN_INTERVAL_S", interval)
    peer = await Peer.open(api)
    await peer.register("j1", 0)
    await until(lambda: len(rec.presence) == 1)
    start = time.monotonic()
    step = 0
    while time.monotonic() - start < 2.5 * interval:
        step += 1
        await peer.send({"v": 1, "op": "heartbeat", "step": step})
        await asyncio.sleep(0.02)
    await asyncio.sleep(1.3 * interval)
    updates = rec.presence[1:]
    assert 1 <= len(updates) <= 4  # ~2.5 intervals of progress, throttled to one report per interval
    assert updates[-1][1][0].step == step
    assert updates[-1][1][0].last_beat is not None
    # no progress, no reports
    count = len(rec.presence)
    await peer.send({"v": 1, "op": "heartbeat", "step": step})
    await asyncio.sleep(1.3 * interval)
    assert len(rec.presence) == count
    await peer.close()


async def test_ranks_silent_for(api: LocalApi) -> None:
    beating, quiet = await Peer.open(api), await Peer.open(api)
    await beating.register("j1", 0)
    await quiet.register("j1", 1)
    for i in range(6):
        await beating.send({"v": 1, "op": "heartbeat", "step": i})
        await asyncio.sleep(0.1)
    silent = api.ranks_silent_for(0.3)
    assert [(job, r.rank) for job, r in silent] == [("j1", 1)]
    assert api.ranks_silent_for(30) == []
    await beating.close()
    await quiet.close()


async def test_failing_callback_does_not_break_the_server(sockdir: str) -> None:
    calls: list[str] = []

    async def boom(*args: Any) -> None:
        calls.append("boom")
        raise RuntimeError("bus down")

    server = LocalApi(os.path.join(sockdir, "b.sock"), "n", boom, boom)
    await server.start()
    try:
        peer = await Peer.open(server)
        await peer.register("j1", 0)
        await peer.send({"v": 1, "op": "ack", "directive_id": "d", "step": 1})
        await until(lambda: len(calls) == 2)
        assert await server.deliver(directive("d9")) == 1
        assert (await peer.recv())["id"] == "d9"
        assert server.counters["callback_errors"] == 2
        await peer.close()
    finally:
        await server.stop()


# --- socket group and mode, peer credentials (issue #11) -----------------------------------------


async def test_socket_group_by_gid_and_mode_are_applied(sockdir: str, rec: Recorder) -> None:
    gid = os.getgroups()[-1] if os.getgroups() else os.getgid()
    path = os.path.join(sockdir, "g.sock")
    server = LocalApi(path, "n", rec.on_presence, rec.on_ack, socket_mode=0o640, socket_group=gid)
    await server.start()
    try:
        st = os.stat(server.socket_path)
        assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o640, gid)
    finally:
        await server.stop()


async def test_an_unknown_socket_group_fails_start_clearly_and_leaves_no_socket(
    sockdir: str, rec: Recorder
) -> None:
    path = os.path.join(sockdir, "u.sock")
    server = LocalApi(path, "n", rec.on_presence, rec.on_ack, socket_group="no-such-group-ftd")
    with pytest.raises(ValueError, match=r"agent\.socket_group: no group named 'no-such-group-ftd'"):
        await server.start()
    assert not exists(path)


async def test_a_trusted_peer_may_register_any_job_and_keeps_its_pid(api: LocalApi) -> None:
    """This test process runs as root or as the agent's own user (outside any job): trusted."""
    peer = await Peer.open(api)
    assert (await peer.register("any-job", 3, pid=4242))["op"] == "ok"
    assert [(r.rank, r.pid) for r in api.jobs()["any-job"]] == [(3, 4242)]
    assert api.counters["registrations_refused"] == 0
    await peer.close()
