"""What the API's ``/v1/jobs`` and ``ftd status`` show of a job run by rank supervisors (``ftd run``,
issue #24): each node's supervisor, the hot spares with their preflight, the slots, the generation,
and that a job restarting inside its allocation is ``restarting``, not ``pending after requeue``."""

from __future__ import annotations

import msgspec

from ftd.commands.status import render
from ftd.coordinator.api.views import jobs_out
from ftd.coordinator.model.state import ClusterState
from ftd.events import JobPresence, NodeStatus, RankInfo, SupervisorInfo
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState


def supervised() -> ClusterState:
    state = ClusterState()
    for node in ("a", "b", "c", "d"):
        state.apply_status(NodeStatus(node=node, state="online", ts=1.0))
    for slot, node in enumerate(("a", "b")):
        info = SupervisorInfo(
            role="active", slot=slot, generation=2, state="running", nodes=2, preflight="ok"
        )
        ranks = [RankInfo(rank=slot, run="gen-2", step=40)]
        state.apply_presence(node, "9", JobPresence(node=node, job="9", ranks=ranks, supervisor=info))
    for node, preflight in (("c", "ok"), ("d", "failed")):
        info = SupervisorInfo(role="spare", state="idle", nodes=2, preflight=preflight)
        state.apply_presence(node, "9", JobPresence(node=node, job="9", supervisor=info))
    return state


def test_the_api_shows_supervisors_spares_slots_and_generation() -> None:
    [job] = msgspec.to_builtins(jobs_out(supervised(), []))
    assert job["nodes"] == ["a", "b"] and job["spares"] == ["c", "d"]
    assert job["slots"] == ["a", "b"] and job["generation"] == 2 and job["state"] == "training"
    assert job["supervisors"]["d"]["preflight"] == "failed" and job["supervisors"]["a"]["slot"] == 0


def test_a_job_restarting_in_its_allocation_is_restarting() -> None:
    request = ActionRequest(kind=ActionKind.CHECKPOINT_RESTART, target="9", reason="xid 79 on b")
    detail = {"phases_done": ["stop", "requeue"], "path": "spare", "generation": 3}
    action = ActionRecord(id="act-1", request=request, state=ActionState.RUNNING, detail=detail)
    [job] = jobs_out(supervised(), [action])
    assert job.state == "restarting" and job.action == "act-1"


def test_status_prints_the_generation_and_the_spares_with_their_preflight() -> None:
    jobs = msgspec.to_builtins(jobs_out(supervised(), []))
    data = {"health": {"version": "x", "bus_connected": True}, "nodes": [], "jobs": jobs, "actions": []}
    text = render(data, "http://coordinator")
    line = next(row for row in text.splitlines() if row.startswith("9 "))
    assert line.split() == ["9", "training", "a,b", "2", "40", "-", "yes", "-", "2", "c,d(failed)"]
    header = next(row for row in text.splitlines() if row.startswith("JOB "))
    assert header.split()[-2:] == ["GEN", "SPARES"]
    spent = dict(jobs[0], spares=[])
    used_up = render({**data, "jobs": [spent]}, "http://coordinator")
    assert next(r for r in used_up.splitlines() if r.startswith("9 ")).split()[-1] == "none"


def test_status_prints_the_newest_checkpoint_verified_on_every_rank() -> None:
    """Issue #34: the CHECKPOINT column is the newest step verified on every rank, at the fastest
    level that holds it; a rank's rejected copy keeps its step out."""
    from ftd.events import Kind, Severity, make_event

    state = supervised()
    for step, level, ranks_ok in ((30, "shared", (0, 1)), (30, "local", (0, 1)), (35, "local", (0,))):
        for rank in (0, 1):
            data = {"job": "9", "rank": rank, "step": step, "level": level, "world_size": 2}
            data.update(ok=rank in ranks_ok, root=f"/ck/{level}", reason="" if rank in ranks_ok else "bad")
            node = ("a", "b")[rank]
            state.apply_event(make_event(node, Kind.CHECKPOINT, severity=Severity.INFO, data=data))
    jobs = msgspec.to_builtins(jobs_out(state, []))
    data = {"health": {"version": "x", "bus_connected": True}, "nodes": [], "jobs": jobs, "actions": []}
    text = render(data, "http://coordinator")
    line = next(row for row in text.splitlines() if row.startswith("9 "))
    assert line.split()[5] == "30/local"
    header = next(row for row in text.splitlines() if row.startswith("JOB "))
    assert header.split()[6] == "CHECKPOINT"
