"""LocalApi and a job's rank supervisor (``ftd run``, issue #24), over a real unix socket with raw
protocol lines: supervise, state changes in the presence at once, restart/stop delivery (pending
for a supervisor that connects later), lost and failed supervisors reported as events."""

from __future__ import annotations

import os
import time
from typing import Any

from ftd.agent.local_api import LocalApi
from ftd.events import Directive, Event, Kind, Severity
from tests.unit.helpers import Recorder, until
from tests.unit.test_local_api import Peer


def info(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"role": "active", "slot": 0, "generation": 0, "state": "running", "nodes": 2}
    return {**base, **kw}


def restart(gen: int, job: str = "j1") -> Directive:
    return Directive(
        id=f"a1-restart-g{gen}",
        ts=time.time(),
        action="restart",
        job=job,
        params={"generation": gen, "slots": ["n1", "n2"], "master_addr": "h1", "resume_step": 10},
    )


async def supervised(api: LocalApi, job: str = "j1", **kw: Any) -> Peer:
    peer = await Peer.open(api)
    await peer.send({"v": 1, "op": "supervise", "job": job, "pid": os.getpid(), "info": info(**kw)})
    assert await peer.recv() == {"v": 1, "op": "ok", "re": "supervise", "node": "node1"}
    return peer


async def started(sockdir: str, rec: Recorder, events: list[Event]) -> LocalApi:
    async def on_event(event: Event) -> None:
        events.append(event)

    api = LocalApi(os.path.join(sockdir, "s.sock"), "node1", rec.on_presence, rec.on_ack, on_event=on_event)
    await api.start()
    return api


async def test_supervise_puts_the_supervisor_in_the_presence_and_state_changes_go_out_at_once(
    sockdir: str, rec: Recorder
) -> None:
    events: list[Event] = []
    api = await started(sockdir, rec, events)
    try:
        peer = await supervised(api, role="spare", slot=None, state="idle", preflight="ok")
        await until(lambda: len(rec.presence) == 1)
        assert rec.presence[0] == ("j1", [])  # no ranks: a presence with only a supervisor
        sup = api.supervisor("j1")
        assert sup is not None and (sup.role, sup.state, sup.preflight, sup.pid) == (
            "spare",
            "idle",
            "ok",
            os.getpid(),
        )
        assert api.hosts("j1") and not api.hosts("j2")
        await peer.send({"v": 1, "op": "supervisor_state", "info": info(generation=1, state="starting")})
        await until(lambda: len(rec.presence) == 2)  # not throttled
        sup = api.supervisor("j1")
        assert sup is not None and (sup.role, sup.slot, sup.generation, sup.state) == (
            "active",
            0,
            1,
            "starting",
        )
        # the clean goodbye: exited, then close -> still in the presence as exited 0 (how it ended:
        # the coordinator releases the job's spares on it), no event; forgotten when the job ends
        await peer.send(
            {"v": 1, "op": "supervisor_state", "info": info(generation=1, state="exited", exit_code=0)}
        )
        await until(lambda: len(rec.presence) == 3)
        await peer.close()
        await until(lambda: len(rec.presence) == 4)
        sup = api.supervisor("j1")
        assert sup is not None and (sup.state, sup.exit_code, sup.generation) == ("exited", 0, 1)
        assert events == []
        api.job_ended("j1")
        assert api.supervisor("j1") is None and not api.hosts("j1")
    finally:
        await api.stop()


async def test_restart_reaches_the_supervisor_never_a_rank_and_stays_pending(
    sockdir: str, rec: Recorder
) -> None:
    events: list[Event] = []
    api = await started(sockdir, rec, events)
    try:
        rank = await Peer.open(api)
        assert (await rank.register("j1", 0, run="gen-0"))["op"] == "ok"
        sup = await supervised(api)
        assert await api.deliver(restart(1)) == 1
        got = await sup.recv()
        assert (got["op"], got["action"], got["id"], got["params"]["generation"]) == (
            "directive",
            "restart",
            "a1-restart-g1",
            1,
        )
        assert await rank.nothing_within(0.3)
        # a stop reaches both the ranks and the supervisor
        stop = Directive(id="a1-stop", ts=time.time(), action="stop", job="j1")
        assert await api.deliver(stop) == 2
        assert (await sup.recv())["id"] == "a1-stop"
        assert (await rank.recv())["id"] == "a1-stop"
        # a supervisor connecting later (a restarted ftd run) gets what is pending for it
        await sup.close()
        await until(lambda: (s := api.supervisor("j1")) is not None and s.state == "lost")
        again = await supervised(api)
        assert {(await again.recv())["id"], (await again.recv())["id"]} == {"a1-restart-g1", "a1-stop"}
        await again.close()
        await rank.close()
    finally:
        await api.stop()


async def test_killed_supervisor_is_lost_with_an_event(sockdir: str, rec: Recorder) -> None:
    events: list[Event] = []
    api = await started(sockdir, rec, events)
    try:
        peer = await supervised(api, slot=1, generation=2)
        await peer.close()  # no exited goodbye
        await until(lambda: len(events) == 1)
        ev = events[0]
        assert (ev.kind, ev.severity, ev.node) == (Kind.SUPERVISOR, Severity.ERROR, "node1")
        assert ev.data == {"job": "j1", "state": "lost", "role": "active", "slot": 1, "generation": 2}
        sup = api.supervisor("j1")
        assert sup is not None and sup.state == "lost"
        assert api.counters["supervisors_lost"] == 1
        api.job_ended("j1")
        assert api.supervisor("j1") is None
    finally:
        await api.stop()


async def test_failed_supervisor_is_an_event_once(sockdir: str, rec: Recorder) -> None:
    events: list[Event] = []
    api = await started(sockdir, rec, events)
    try:
        peer = await supervised(api, role="spare", slot=None, state="idle")
        failed = info(role="active", slot=1, generation=1, state="failed", reason="preflight: gpu 0 missing")
        await peer.send({"v": 1, "op": "supervisor_state", "info": failed})
        await peer.send({"v": 1, "op": "supervisor_state", "info": failed})  # the same again: no second event
        await until(lambda: len(events) == 1)
        await until(lambda: len(rec.presence) == 3)
        assert events[0].data == {
            "job": "j1",
            "state": "failed",
            "role": "active",
            "slot": 1,
            "generation": 1,
            "reason": "preflight: gpu 0 missing",
        }
        assert len(events) == 1
        await peer.close()
        await until(lambda: len(events) == 2)  # then lost (no goodbye)
    finally:
        await api.stop()


async def test_bad_supervisor_messages_are_errors_and_the_connection_stays(
    sockdir: str, rec: Recorder
) -> None:
    api = await started(sockdir, rec, [])
    try:
        peer = await Peer.open(api)
        await peer.send({"v": 1, "op": "supervisor_state", "info": info()})
        assert (await peer.recv())["error"] == "not supervising: send supervise first"
        await peer.send({"v": 1, "op": "supervise", "job": "j1", "info": info(state="dancing")})
        assert (await peer.recv())["op"] == "error"
        await peer.send({"v": 1, "op": "supervise", "job": "j/1", "info": info()})
        assert (await peer.recv())["op"] == "error"
        for bad, why in (
            (info(slot=2, nodes=2), "slot 2 is not in 0..1"),
            (info(generation=-1), "generation must be >= 0, nodes and nproc >= 1"),
            (info(addr="a" * 300), "addr longer than 256 characters"),
        ):
            await peer.send({"v": 1, "op": "supervise", "job": "j1", "info": bad})
            got = await peer.recv()
            assert got.get("error") == why, got
        await peer.send(
            {"v": 1, "op": "supervise", "job": "j1", "info": info(state="failed", reason="x" * 5000)}
        )
        assert (await peer.recv())["op"] == "ok"
        kept = api.supervisor("j1")
        assert kept is not None and kept.reason == "x" * 4096  # cut to the protocol's TEXT_MAX
        rank = await Peer.open(api)
        assert (await rank.register("j1", 0))["op"] == "ok"
        await rank.send({"v": 1, "op": "supervise", "job": "j1", "info": info()})
        err = await rank.recv()
        assert err["op"] == "error" and "already registered as job j1 rank 0" in err["error"]
        await peer.close()
        await rank.close()
    finally:
        await api.stop()


async def test_a_restarted_api_forgets_the_supervisors_until_they_come_back(
    sockdir: str, rec: Recorder
) -> None:
    api = await started(sockdir, rec, [])
    try:
        peer = await supervised(api)
        await api.deliver(restart(3))
        assert (await peer.recv())["id"] == "a1-restart-g3"
        await api.stop()
        assert api.supervisor("j1") is None  # not a stale "running" in the presence
        await api.start()
        again = await supervised(api, generation=3)
        assert (await again.recv())["id"] == "a1-restart-g3"  # still pending for it
        sup = api.supervisor("j1")
        assert sup is not None and sup.generation == 3
        await again.close()
    finally:
        await api.stop()
