"""The coordinator's bisection (ftd/coordinator/upkeep/fabric_tests.py) and its API.

Each wave's pairs become pair_test actions through ``submit``; here a stand-in for the engine answers
each action as the agents would (a fault model: one node's egress at 0.02 Gbit/s), sometimes only
later through ``observe``. The slow node must be pinned, a training node never tested, and the API
starts one (202), refuses a second while it runs (409) and serves the finding.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import ApiConfig, Config, CoordinatorConfig
from ftd.config.schema import HardwareConfig
from ftd.coordinator.api import Api
from ftd.coordinator.ledger.sqlite import Ledger
from ftd.coordinator.model.state import ClusterState
from ftd.coordinator.upkeep.fabric_tests import FabricTests
from ftd.coordinator.wiring import build
from ftd.events import Directive, JobAllocation, JobPresence, Kind, NodeStatus, Severity, make_event
from ftd.fabric.pairs import PairResult
from ftd.plugin.actions import ActionRecord, ActionRequest, ActionState

ids = itertools.count()
AUTH = {"Authorization": "Bearer t0ken"}


class Agents:
    """The engine's submit as the agents would answer pair_test actions (some later, via observe)."""

    def __init__(self, slow: str, later: bool) -> None:
        self.slow = slow
        self.later = later
        self.tests: list[tuple[str, str]] = []
        self.observer: FabricTests | None = None

    async def submit(self, request: ActionRequest) -> ActionRecord:
        a, b = request.target, str(request.params["peer"])
        self.tests.append((a, b))
        result = PairResult(
            a=a,
            b=b,
            a_to_b_gbps=0.02 if a == self.slow else 20.0,
            b_to_a_gbps=0.02 if b == self.slow else 21.0,
        )
        record = ActionRecord(id=f"p{next(ids)}", request=request, state=ActionState.RUNNING)
        if not self.later:
            record.state = ActionState.SUCCEEDED
            record.detail["result"] = result.as_dict()
            return record

        async def finish() -> None:
            await asyncio.sleep(0)
            record.state = ActionState.SUCCEEDED
            record.detail["result"] = result.as_dict()
            assert self.observer is not None
            self.observer.observe("action", record)

        asyncio.get_running_loop().create_task(finish())
        return record


def _state(n: int, training: str | None = None) -> ClusterState:
    state = ClusterState()
    for i in range(n):
        state.apply_status(NodeStatus(node=f"n{i:02d}", state="online", ts=1.0, addresses=[f"10.0.0.{i}"]))
    if training:
        presence = JobPresence(job="j1", node=training, allocation=JobAllocation(started=1.0))
        state.apply_presence(training, "j1", presence)
    return state


def test_the_slow_node_is_pinned_and_a_training_node_never_tested() -> None:
    for later in (False, True):
        agents = Agents(slow="n05", later=later)
        state = _state(9, training="n08")
        tests = FabricTests(agents.submit, state, hardware=HardwareConfig(profile="h200-sxm"), deadline_s=5.0)
        agents.observer = tests
        last = asyncio.run(tests.bisect())
        assert last["bad_nodes"] == ["n05"] and last["confirmed"], last
        assert last["nodes"] == [f"n{i:02d}" for i in range(8)]
        assert all("n08" not in pair for pair in agents.tests)
        assert last["pair_tests"] and all(t["action_id"].startswith("p") for t in last["pair_tests"])
        assert last["tests"] == len(last["pair_tests"])


def test_with_no_profile_and_no_history_a_lone_test_is_not_judged() -> None:
    agents = Agents(slow="n02", later=False)
    tests = FabricTests(agents.submit, _state(4), hardware=HardwareConfig(), deadline_s=1.0)
    last = asyncio.run(tests.bisect(suspects=["n02"], budget=1))
    assert not last["bad_nodes"] and last["pair_tests"][0]["status"] == "skipped"
    assert "hardware.profile not set" in last["note"]


def test_an_unanswered_test_proves_nothing() -> None:
    async def silent(request: ActionRequest) -> ActionRecord:
        return ActionRecord(
            id=f"p{next(ids)}", request=request, state=ActionState.FAILED, detail={"pair_test": "no answer"}
        )

    tests = FabricTests(silent, _state(4), hardware=HardwareConfig(), deadline_s=1.0)
    last = asyncio.run(tests.bisect())
    assert not last["bad_nodes"] and last["untested"] == ["n00", "n01", "n02", "n03"]


def test_the_api_starts_one_bisection_at_a_time_and_serves_the_finding() -> None:
    async def main() -> list[tuple[int, Any]]:
        config = Config(
            coordinator=CoordinatorConfig(scheduler="slurm"), hardware=HardwareConfig(profile="l40s")
        )
        coordinator = build(config, bus=MemoryBus(MemoryBroker()), scheduler=None, ledger=Ledger(":memory:"))
        for i in range(4):
            status = NodeStatus(node=f"n{i:02d}", state="online", ts=1.0, addresses=[f"10.0.0.{i}"])
            coordinator.state.apply_status(status)
        agents = Agents(slow="n02", later=True)
        tests = FabricTests(agents.submit, coordinator.state, hardware=config.hardware, deadline_s=5.0)
        agents.observer = tests
        coordinator.fabric_tests = tests
        client: TestClient[Any, Any] = TestClient(
            TestServer(Api(coordinator, ApiConfig(), token="t0ken").app)
        )
        await client.start_server()
        out = []
        try:
            for _ in range(2):
                response = await client.post("/v1/fabric/bisect", json={"suspects": ["n02"]}, headers=AUTH)
                out.append((response.status, await response.json()))
            for _ in range(100):
                if not tests.running:
                    break
                await asyncio.sleep(0.01)
            response = await client.get("/v1/fabric/bisect")
            out.append((response.status, await response.json()))
        finally:
            await client.close()
        return out

    (first, started), (second, refused), (status, body) = asyncio.run(main())
    assert first == 202 and started["idle"] == ["n00", "n01", "n02", "n03"]
    assert second == 409 and "running" in refused["error"]
    assert status == 200 and body["running"] is False
    assert body["last"]["bad_nodes"] == ["n02"] and body["last"]["suspects"] == ["n02"], body


def test_a_slow_pair_test_starts_one_bisection_with_its_slow_side_first() -> None:
    async def main() -> tuple[dict[str, Any] | None, int, list[tuple[str, str]]]:
        agents = Agents(slow="n03", later=False)
        state = _state(6)
        tests = FabricTests(
            agents.submit, state, hardware=HardwareConfig(profile="h200-sxm"), auto=True, cooldown_s=600.0
        )
        agents.observer = tests
        fast = PairResult(a="n00", b="n01", a_to_b_gbps=24.0, b_to_a_gbps=24.0).as_dict()
        slow = PairResult(a="n02", b="n03", a_to_b_gbps=24.0, b_to_a_gbps=0.02).as_dict()
        tests.observe("event", make_event("n00", Kind.PAIR_TEST, severity=Severity.INFO, data=fast))
        assert not tests.running, "a passing pair starts nothing"
        for _ in range(2):  # the second within the cooldown starts nothing more
            tests.observe("event", make_event("n02", Kind.PAIR_TEST, severity=Severity.INFO, data=slow))
        await tests.settle()
        first = agents.tests[0]
        tests.observe("event", make_event("n02", Kind.PAIR_TEST, severity=Severity.INFO, data=slow))
        return tests.last, len(agents.tests), [first]

    last, count, first = asyncio.run(main())
    assert last is not None and last["suspects"] == ["n03"] and last["bad_nodes"] == ["n03"]
    assert first[0][0] == "n03", "the suspect is tested first"
    assert count == last["tests"], "one bisection only"


def test_the_api_refuses_a_bisection_with_fewer_than_two_idle_nodes() -> None:
    async def main() -> tuple[int, Any]:
        config = Config(coordinator=CoordinatorConfig(scheduler="slurm"))
        coordinator = build(config, bus=MemoryBus(MemoryBroker()), scheduler=None, ledger=Ledger(":memory:"))
        coordinator.state.apply_status(NodeStatus(node="n00", state="online", ts=1.0, addresses=["10.0.0.1"]))
        client: TestClient[Any, Any] = TestClient(
            TestServer(Api(coordinator, ApiConfig(), token="t0ken").app)
        )
        await client.start_server()
        try:
            response = await client.post("/v1/fabric/bisect", json={}, headers=AUTH)
            return response.status, await response.json()
        finally:
            await client.close()

    status, body = asyncio.run(main())
    assert status == 409 and "two idle" in body["error"]


def test_the_pingmesh_probes_every_pair_of_idle_nodes_in_turn_for_zero_bytes() -> None:
    state = _state(4, training="n03")  # n03 trains: never probed
    state.apply_status(NodeStatus(node="n04", state="online", ts=1.0, addresses=["only-a-name"]))
    tests = FabricTests(Agents("x", False).submit, state, hardware=HardwareConfig())
    sent: list[Directive] = []
    forgotten: list[str] = []

    six = asyncio.Event()

    async def send(node: str, directive: Directive) -> None:
        assert directive.node == node
        sent.append(directive)
        if len(sent) >= 6:
            six.set()

    async def main() -> None:
        for _ in range(4):
            await tests.probe(send, 7411)
        task = asyncio.create_task(tests.run_mesh(send, port=7411, interval_s=0.001, forget=forgotten.append))
        async with asyncio.timeout(30):
            await six.wait()
        task.cancel()

    asyncio.run(main())
    pairs = [(d.node, d.params["peer"]) for d in sent[:4]]
    assert pairs == [("n00", "n01"), ("n00", "n02"), ("n01", "n02"), ("n00", "n01")]
    assert all(d.action == "pair_test" and d.params["max_bytes"] == 0 for d in sent)
    assert sent[0].params["host"] == "10.0.0.1" and sent[0].params["port"] == 7411
    assert forgotten and forgotten[0] == sent[3].id, "the previous probe's answer is dropped"


def test_passive_evidence_on_a_nodes_link_starts_a_bisection_with_that_node_first() -> None:
    """Issue #35 item 4: a port's error counter crossing its rule, a port below its profile's rate or a
    NIC's PCIe link degraded names its node as the suspect; congestion, a GPU's link, a cleared
    condition or a skipped check starts nothing."""
    from ftd.coordinator.upkeep.fabric_tests import passive_suspect

    def fabric(node: str, **data: object) -> Any:
        return make_event(node, Kind.FABRIC, severity=Severity.WARNING, data=dict(data))

    crossed = fabric("n03", check="counter", status="crossed", source="ib", **{"class": "fatal"})
    assert passive_suspect(crossed)
    assert passive_suspect(fabric("n03", check="port_rate", status="degraded"))
    nic = make_event(
        "n03", Kind.PCIE_LINK, severity=Severity.WARNING, data={"status": "degraded", "device": "nic mlx5_0"}
    )
    assert passive_suspect(nic)
    for quiet in (
        fabric("n03", check="counter", status="crossed", source="phy", **{"class": "congestion"}),
        fabric("n03", check="counter", status="crossed", source="nvlink", **{"class": "fatal"}),
        fabric("n03", check="counter", status="cleared", source="ib", **{"class": "fatal"}),
        fabric("n03", check="skipped", what="ethtool"),
        make_event(
            "n03", Kind.PCIE_LINK, severity=Severity.WARNING, data={"status": "degraded", "device": "gpu0"}
        ),
    ):
        assert not passive_suspect(quiet), quiet.data

    async def main() -> tuple[dict[str, Any] | None, list[tuple[str, str]]]:
        agents = Agents(slow="n03", later=False)
        state = _state(6)
        tests = FabricTests(
            agents.submit, state, hardware=HardwareConfig(profile="h200-sxm"), auto=True, cooldown_s=600.0
        )
        agents.observer = tests
        tests.observe("event", crossed)
        tests.observe("event", nic)  # within the cooldown: nothing more
        await tests.settle()
        return tests.last, list(agents.tests)

    last, sent = asyncio.run(main())
    assert last is not None and last["suspects"] == ["n03"] and last["bad_nodes"] == ["n03"]
    assert sent[0][0] == "n03" and len(sent) == last["tests"]
