"""The coordinator's side of issue #36: inventories kept per node (interned), drift judged after a
burst and raised/cleared naming the fields, and what drift does per ``coordinator.drift.action``:
warn only, a failed preflight (the preflight executor), a spare that is never chosen."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ftd.catalog.hardware_profiles import load_hardware_catalog
from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.preflight import Preflight
from ftd.coordinator.actions.restart_phase import InAllocation
from ftd.coordinator.intake.inventory import InventoryIntake
from ftd.coordinator.model.inventory import InventoryBook
from ftd.coordinator.model.state import ClusterState
from ftd.events import NODE_RANK, Ack, Directive, Kind, make_event
from ftd.platform.inventory import GpuFacts, Inventory, known, unknown
from ftd.plugin.actions import ActionRecord, ActionRequest, ActionState
from ftd.plugin.view import JobRecord
from tests.unit.helpers import supervisor_info

CATALOG = load_hardware_catalog()


def inventory(
    driver: str = "550.54.15", vbios: str = "96.00.89.00.01", serial: str = "1650000000001"
) -> Inventory:
    gpus = [
        GpuFacts(i, known("NVIDIA H100 80GB HBM3"), known(f"{serial}{i}"), known(vbios)) for i in range(8)
    ]
    return Inventory(
        profile=known("h100-sxm"),
        driver=known(driver),
        cuda=known("12.4"),
        vbios=known(vbios),
        gpu_serials=known(",".join(f"{serial}{i}" for i in range(8))),
        nic_firmware=known("28.39.1002"),
        ofed=unknown("ofed_info not found"),
        nccl=unknown("no job yet"),
        kernel=known("5.15.0-91-generic"),
        os=known("Ubuntu 22.04.3 LTS"),
        gpus=gpus,
    )


INTERN_MIN_TEST = 2000


def book(action: str = "warn") -> InventoryBook:
    b = InventoryBook()
    b.intern_min = b._intern_limit = INTERN_MIN_TEST  # small, so a test reaches it
    b.configure(
        minimums=lambda p: CATALOG.section("versions", p),
        action=action,
        fields=("driver", "cuda", "vbios", "nic_firmware", "ofed", "kernel", "os"),
        min_peers=3,
    )
    return b


def fill(b: InventoryBook, n: int = 16, /, **odd: Inventory) -> None:
    for i in range(n):
        name = f"node-{i:02d}"
        b.note(name, odd.get(name, inventory(serial=f"16{i:04d}")).to_data(), ts=1000.0)


def test_sixteen_identical_nodes_raise_nothing_and_share_their_facts() -> None:
    b = book()
    fill(b)
    assert b.refresh() == []
    assert b.drifted() == {}
    one, two = b.inventories["node-00"], b.inventories["node-01"]
    assert one.driver is two.driver and one.gpus[0].vbios is two.gpus[0].vbios  # interned, stored once
    assert one.gpus[0].serial is not two.gpus[0].serial


def test_a_drifted_node_raises_a_condition_naming_the_field_and_clears_when_fixed() -> None:
    b = book()
    fill(b, **{"node-05": inventory(driver="535.104.05")})
    changes = b.refresh()
    assert [(c.node, c.raised, c.report.fields) for c in changes] == [("node-05", True, ("driver",))]
    view = b.view("node-05")
    assert view is not None and view["drift"]["fields"] == ["driver"]
    assert view["facts"]["ofed"] == "unknown (ofed_info not found)"
    b.note("node-05", inventory().to_data())
    changes = b.refresh()
    assert [(c.node, c.raised) for c in changes] == [("node-05", False)]
    assert b.drifted() == {}


def test_bad_reports_are_counted_and_change_nothing() -> None:
    b = book()
    fill(b, 3)
    assert not b.note("node-00", {"driver": 17})
    assert b.rejected == 1 and b.inventories["node-00"].driver.value == "550.54.15"


def test_the_state_folds_inventory_events_and_names_drift_on_the_node_record() -> None:
    state = ClusterState()
    state.inventory.configure(minimums=lambda p: CATALOG.section("versions", p), action="warn",
                              fields=("driver", "vbios"), min_peers=3)  # fmt: skip
    for i in range(16):
        inv = inventory(vbios="96.00.74.00.1C") if i == 3 else inventory()
        state.apply_event(make_event(f"node-{i}", Kind.INVENTORY, severity="info", data=inv.to_data()))
    changes = state.refresh_drift()
    assert [c.node for c in changes] == ["node-3"]
    record = state.node("node-3")
    assert record is not None and record.drift == ("vbios",)


async def test_the_intake_judges_once_after_a_burst() -> None:
    state = ClusterState()
    intake = InventoryIntake(state, settle_s=30.0)
    timers = []
    for i in range(16):
        inv = inventory(driver="535.104.05") if i == 9 else inventory()
        event = make_event(f"node-{i}", Kind.INVENTORY, severity="info", data=inv.to_data())
        state.apply_event(event)
        intake.observe("event", event)
        timers.append(intake._pending)
    assert timers[0] is not None and all(t is timers[0] for t in timers)  # one pass for the burst
    assert timers[0].when() - asyncio.get_running_loop().time() > 25  # after settle_s
    changes = intake.judge()  # what the timer runs
    assert [(c.node, c.report.fields) for c in changes] == [("node-9", ("driver",))]
    assert intake.passes == 1 and intake._pending is None
    intake.observe("event", make_event("node-1", Kind.LOG_PATTERN, severity="info"))  # other kinds: nothing
    assert intake._pending is None


@pytest.mark.parametrize("action", ["warn", "preflight_fail", "no_spare"])
def test_each_action_refuses_only_what_it_says(action: str) -> None:
    b = book(action)
    fill(b, **{"node-05": inventory(driver="535.104.05")})
    assert (b.refuses_preflight("node-05") is not None) == (action == "preflight_fail")
    assert (b.blocks_spare("node-05") is not None) == (action != "warn")  # failing preflight: no spare
    assert b.refuses_preflight("node-04") is None and b.blocks_spare("node-04") is None


async def test_preflight_fails_for_drift_whatever_the_agent_answers() -> None:
    acks = AckBook()
    b = book("preflight_fail")
    fill(b, **{"node-05": inventory(driver="535.104.05")})

    async def send(node: str, directive: Directive) -> None:
        acks.record(
            Ack(directive_id=directive.id, job="", rank=NODE_RANK, node=node, reason="all 9 checks passed")
        )

    executor = Preflight(send=send, acks=acks, deadline_s=5.0, refuse=b.refuses_preflight)
    record = ActionRecord(id="a1", request=ActionRequest(kind="preflight", target="node-05", reason="t"),
                          state=ActionState.RUNNING)  # fmt: skip
    detail: dict[str, Any] = await executor(record)
    assert detail["state"] == "escalated" and detail["passed"] is False
    assert "version drift (driver: 535.104.05 differs" in detail["preflight"]
    assert "all 9 checks passed" in detail["preflight"]
    record.request = ActionRequest(kind="preflight", target="node-04", reason="t")
    record.id = "a2"
    assert (await executor(record))["passed"] is True


def test_a_drifted_spare_is_unfit_with_no_spare() -> None:
    state = ClusterState()
    state.inventory.configure(minimums=lambda p: CATALOG.section("versions", p), action="no_spare",
                              fields=("driver",), min_peers=3)  # fmt: skip
    for i in range(6):
        inv = inventory(driver="535.104.05") if i == 4 else inventory()
        state.inventory.put(f"n{i}", inv)
    job = JobRecord("7")
    job.supervisors = {
        "n0": supervisor_info("active", 0, preflight="ok"),
        "n4": supervisor_info("spare", None, state="idle", preflight="ok"),
        "n5": supervisor_info("spare", None, state="idle", preflight="ok"),
    }
    phase = InAllocation(publish=_no_publish, state=state)
    record = ActionRecord(id="r", request=ActionRequest(kind="checkpoint_restart", target="7", reason="t"),
                          state=ActionState.RUNNING)  # fmt: skip
    unfit = phase.unfit(record, job)
    assert unfit.get("n4", "").startswith("version drift (driver:")
    assert "n5" not in unfit and "n0" not in unfit


async def _no_publish(*_a: Any, **_k: Any) -> None:
    return None


def test_the_intern_table_forgets_what_no_node_holds() -> None:
    b = book()
    fill(b, 4)
    for i in range(3000):  # one node reporting ever-new values (a hostile one, or GPUs swapped daily)
        b.note("node-00", inventory(driver=f"550.{i}.1", vbios=f"96.00.{i}").to_data())
    assert len(b._interned) < 2 * INTERN_MIN_TEST + 100
    assert b.inventories["node-00"].driver.value == "550.2999.1"
    assert b.inventories["node-01"].driver is b.inventories["node-02"].driver  # still shared after a rebuild
    b.refresh()
    assert set(b.drifted()) == {"node-00"}
