"""Issue #20, items 1 and 5, on an in-process LocalApi (the real-parts tests are
tests/e2e/test_run_bound_directives.py and tests/e2e/test_heartbeat_startup.py): directives bound to
one run of a job, dropped when they are stale; silence counted from the first heartbeat."""

from __future__ import annotations

import asyncio
import time

from ftd.agent.local_api import LocalApi
from ftd.client import Client
from tests.unit.helpers import until
from tests.unit.test_local_api import Peer, directive

__all__: list[str] = []


async def test_a_stop_for_one_run_never_reaches_the_next(api: LocalApi) -> None:
    old = await Peer.open(api)
    await old.register("j1", 0, run="slurm-restart-0")
    await api.deliver(directive("stop1", action="stop", deadline_s=60))
    assert (await old.recv())["id"] == "stop1"
    new = await Peer.open(api)  # the restarted job's rank, while the old one is still connected
    await new.register("j1", 0, run="slurm-restart-1")
    assert await new.nothing_within(0.3)
    assert api.pending() == []  # a rank of a new run registered: the old run's stop is stale
    await old.close()
    await new.close()


async def test_a_stop_is_dropped_when_the_ranks_it_reached_leave(api: LocalApi) -> None:
    r0 = await Peer.open(api)
    await r0.register("j1", 0)  # an older client: no run
    await api.deliver(directive("stop1", action="stop", deadline_s=60))
    await api.deliver(directive("save1", action="save", deadline_s=60))
    assert {(await r0.recv())["id"], (await r0.recv())["id"]} == {"stop1", "save1"}
    await r0.close()  # left without acknowledging (no close() in the loop)
    await until(lambda: [d.id for d in api.pending()] == ["save1"])
    again = await Peer.open(api)  # the next process of the job, same rank, no run either
    await again.register("j1", 0)
    assert (await again.recv())["id"] == "save1"  # an unanswered save still reaches a reconnect
    assert await again.nothing_within(0.3)  # ... the stop never does
    await again.close()


async def test_the_coordinators_run_binds_a_directive_delivered_while_no_rank_is_connected(
    api: LocalApi,
) -> None:
    await api.deliver(directive("stop1", action="stop", deadline_s=60, params={"run": "slurm-restart-0"}))
    new = await Peer.open(api)
    await new.register("j1", 0, run="slurm-restart-1")
    assert await new.nothing_within(0.3)
    await new.close()
    await api.deliver(directive("save2", params={"run": "slurm-restart-1"}, deadline_s=60))
    same = await Peer.open(api)
    await same.register("j1", 1, run="slurm-restart-1")
    assert (await same.recv())["id"] == "save2"
    await same.close()


async def test_job_started_drops_what_was_pending_for_the_job(api: LocalApi) -> None:
    await api.deliver(directive("stop1", action="stop", deadline_s=60))
    await api.deliver(directive("other", action="stop", job="j2", deadline_s=60))
    api.job_started("j1")
    assert [d.id for d in api.pending()] == ["other"]


async def test_client_ignores_a_directive_for_another_run(api: LocalApi) -> None:
    client = Client(job="j1", rank=0, socket_path=api.socket_path, run="slurm-restart-1")
    try:
        await until(lambda: client.connected)
        await api.deliver(directive("stop0", action="stop", params={"run": "slurm-restart-0"}))
        await api.deliver(directive("save1", params={"run": "slurm-restart-1"}))
        await until(lambda: client.should_save())
        assert not client.should_stop()
    finally:
        await asyncio.to_thread(client.close)


async def test_silence_counts_from_the_first_heartbeat_with_a_startup_timeout(api: LocalApi) -> None:
    slow = await Peer.open(api)
    await slow.register("j1", 0)
    own = await Peer.open(api)
    await own.register("j1", 1, startup_timeout_s=0.3)
    await asyncio.sleep(0.5)
    # rank 0 never beat: the agent's start-up timeout (60 s here) applies, not the 0.2 s one
    assert [(j, i.rank, t) for j, i, t in api.silent_ranks(0.2, 60)] == [("j1", 1, 0.3)]
    await slow.send({"v": 1, "op": "heartbeat", "step": 1})
    await until(lambda: any(i.rank == 0 and i.last_beat for i in api.jobs()["j1"]))
    started = time.monotonic()
    await until(lambda: any(i.rank == 0 for _, i, _ in api.silent_ranks(0.2, 60)))
    assert time.monotonic() - started < 5  # after its first beat, the short timeout applies
    await slow.close()
    await own.close()
