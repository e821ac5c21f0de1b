"""A finished ``ftd run`` job's spares are released (issue #24): when its training ended (a slot
supervisor of the newest generation exited 0 and none of that generation still runs), the spare and
out supervisors still waiting get one ``release`` directive, with each node's run; never while the
job may still train or restart, never twice for the same nodes."""

from __future__ import annotations

from typing import Any

import pytest

from ftd.coordinator.actions import release as release_module
from ftd.coordinator.actions.release import SpareRelease, spares_to_release
from ftd.coordinator.model.state import ClusterState
from ftd.events import Directive, JobPresence, NodeStatus, SupervisorInfo, decode
from tests.unit.helpers import supervisor_info

JOB = "77"
RUN = "slurm-restart-0"


def sup(
    role: str = "active", slot: int | None = None, gen: int = 0, state: str = "running", **kw: Any
) -> SupervisorInfo:
    return supervisor_info(role, slot, gen, state, nodes=2, run=RUN, **kw)


def cluster(supervisors: dict[str, SupervisorInfo]) -> ClusterState:
    state = ClusterState()
    for node, info in supervisors.items():
        state.apply_status(NodeStatus(node=node, state="online", ts=1.0))
        state.apply_presence(node, JOB, JobPresence(node=node, job=JOB, supervisor=info))
    return state


DONE = {
    "n0": sup(slot=0, gen=1, state="exited", exit_code=0),
    "n1": sup(slot=1, gen=1, state="exited", exit_code=0),
    "s1": sup(role="spare", gen=1, state="idle"),
    "n9": sup(role="out", gen=0, state="stopped"),  # swapped out in generation 1
}


@pytest.mark.parametrize(
    ("changes", "want"),
    [
        ({}, (1, ["n9", "s1"])),
        ({"n1": sup(slot=1, gen=1, state="running")}, None),  # one slot still trains
        ({"n1": sup(slot=1, gen=1, state="stopped")}, None),  # stopped for a restart
        (
            {"n0": sup(slot=0, gen=1, state="exited", exit_code=1), "n1": sup(slot=1, gen=1, state="lost")},
            None,
        ),
        ({"n1": sup(slot=1, gen=1, state="lost")}, (1, ["n9", "s1"])),  # one finished, the other gone
        ({"n1": sup(slot=1, gen=2, state="starting")}, None),  # a newer generation starts
        (
            {
                "s1": sup(role="spare", gen=1, state="lost"),
                "n9": sup(role="out", state="exited", exit_code=0),
            },
            None,
        ),
        ({"s1": sup(role="spare", gen=1, state="failed")}, (1, ["n9", "s1"])),  # a failed spare waits too
    ],
)
def test_when_the_training_ended_and_which_supervisors_go(
    changes: dict[str, SupervisorInfo], want: tuple[int, list[str]] | None
) -> None:
    record = cluster({**DONE, **changes}).jobs[JOB]
    assert spares_to_release(record) == want


def test_a_job_without_slot_supervisors_releases_nothing() -> None:
    # Generation 0 of a job whose spares said supervise before any training node did.
    record = cluster({"s1": sup(role="spare", state="idle")}).jobs[JOB]
    assert spares_to_release(record) is None


def test_a_finished_slot_is_not_a_node_the_job_trains_on() -> None:
    state = cluster(DONE)
    assert state.jobs[JOB].nodes == [] and state.jobs_on_node("n0") == []
    running = cluster({**DONE, "n0": sup(slot=0, gen=1, state="running")})
    assert running.jobs[JOB].nodes == ["n0"]


class Bus:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Directive]] = []
        self.down = False

    async def publish(self, topic: str, payload: bytes) -> None:
        if self.down:
            raise ConnectionError("broker unreachable")
        self.sent.append((topic, decode(payload, Directive)))


async def test_one_release_per_generation_to_the_waiting_nodes_with_their_runs() -> None:
    bus = Bus()
    release = SpareRelease(bus.publish)
    state = cluster(DONE)
    assert await release.check(JOB, state.jobs[JOB]) == ["n9", "s1"]
    assert [t for t, _ in bus.sent] == ["ftd/v1/nodes/n9/directives/jobs", "ftd/v1/nodes/s1/directives/jobs"]
    directive = bus.sent[0][1]
    assert (directive.action, directive.job, directive.id) == ("release", JOB, f"release-{JOB}-g1-2")
    assert directive.params == {"generation": 1, "runs": {"n9": RUN, "s1": RUN}}
    assert await release.check(JOB, state.jobs[JOB]) == []  # the next presence: already told
    assert len(bus.sent) == 2
    # a restarted coordinator (new memory) tells them again: idempotent at the supervisor
    assert await SpareRelease(bus.publish).check(JOB, state.jobs[JOB]) == ["n9", "s1"]


async def test_a_release_the_bus_refused_is_sent_with_the_next_presence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(release_module, "RELEASE_SEND_S", 0.05)
    bus = Bus()
    bus.down = True
    release = SpareRelease(bus.publish)
    state = cluster(DONE)
    assert await release.check(JOB, state.jobs[JOB]) == []
    bus.down = False
    assert await release.check(JOB, state.jobs[JOB]) == ["n9", "s1"]
