"""Step timing in heartbeats (issue #33): the agent keeps a rank's latest counters and puts them in
the job's presence; hostile counters are refused with an error line, the connection stays; a
heartbeat without timing (an older client) is what it always was. Real unix sockets, raw lines."""

from __future__ import annotations

import asyncio

import pytest

from ftd.agent.local_api import LocalApi
from ftd.client import protocol
from ftd.events import StepTiming
from tests.unit.helpers import Recorder, until
from tests.unit.test_local_api import Peer


async def test_timing_rides_in_the_presence(api: LocalApi, rec: Recorder) -> None:
    peer = await Peer.open(api)
    await peer.register("j1", 0)
    await peer.send(dict(protocol.heartbeat(1)))  # an older client's heartbeat: no timing
    await until(lambda: any(r[1] and r[1][0].step == 1 for r in rec.presence))
    assert rec.presence[-1][1][0].timing is None
    timing = {"steps": 41, "step_s": 12.5, "compute_s": 9.25}
    await peer.send(dict(protocol.heartbeat(42, timing)))
    await until(lambda: any(r[1] and r[1][0].step == 42 for r in rec.presence), within=10)
    assert rec.presence[-1][1][0].timing == StepTiming(steps=41, step_s=12.5, compute_s=9.25)
    await peer.close()


@pytest.mark.parametrize(
    "timing",
    [
        {"steps": -1, "step_s": 1.0},
        {"steps": 1, "step_s": -0.5},
        {"steps": 1, "step_s": 1e300},
        {"steps": 1, "step_s": 1.0, "compute_s": "lots"},
        {"steps": 2**60, "step_s": 1.0},
        [1, 2, 3],
        "fast",
    ],
)
async def test_hostile_timing_is_an_error_and_the_connection_stays(
    api: LocalApi, rec: Recorder, timing: object
) -> None:
    peer = await Peer.open(api)
    await peer.register("j1", 0)
    await peer.send({"v": 1, "op": "heartbeat", "step": 3, "timing": timing})
    answer = await peer.recv()
    assert answer["op"] == "error" and answer["re"] == "heartbeat", answer
    await peer.send(dict(protocol.heartbeat(4, {"steps": 1, "step_s": 0.5, "compute_s": None})))
    await until(lambda: any(r[1] and r[1][0].step == 4 for r in rec.presence), within=10)
    assert rec.presence[-1][1][0].timing == StepTiming(steps=1, step_s=0.5)
    await peer.close()


async def test_a_real_client_sends_its_step_timing_with_its_heartbeats(api: LocalApi) -> None:
    from ftd.client import Client

    client = Client(job="j1", rank=0, socket_path=api.socket_path, heartbeat_interval=0.05)
    try:
        await until(lambda: client.connected)
        for step in range(20):
            client.heartbeat(step)
            client.waited(0.001)  # what the torch helper reports of its collectives
            await asyncio.sleep(0.01)
        await until(lambda: (api.jobs()["j1"][0].timing or StepTiming()).steps == 19, within=10)
        timing = api.jobs()["j1"][0].timing
        assert timing is not None and timing.step_s > 0 and timing.compute_s is not None
        assert 0 < timing.compute_s < timing.step_s
    finally:
        client.close()
