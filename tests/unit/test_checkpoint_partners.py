"""The coordinator's checkpoint partners (issue #34): chosen across failure domains, never a sick node,
sent when they change, handed to the ranks by the agent as the trainer protocol's partners op."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.agent.local_api import LocalApi
from ftd.coordinator.actions.partners import CheckpointPartners, choose_partners
from ftd.events import Directive, RankInfo, decode
from ftd.plugin.view import JobRecord
from tests.properties import examples
from tests.unit.test_local_api import Peer


def test_partners_live_in_another_rack_and_spread_evenly() -> None:
    racks = {"a1": "A", "a2": "A", "b1": "B", "b2": "B"}
    got = choose_partners(["a1", "a2", "b1", "b2"], racks)
    assert all(racks[node] != racks[partner] for node, partner in got.items())
    assert sorted(got.values()) == ["a1", "a2", "b1", "b2"]  # each node holds exactly one replica set
    assert choose_partners(["b2", "a1", "b1", "a2"], racks) == got  # the same inputs, the same answer


def test_a_node_with_an_active_condition_is_nobody_s_partner() -> None:
    got = choose_partners(["n1", "n2", "n3"], {}, bad={"n2"})
    assert "n2" not in got.values() and set(got) == {"n1", "n2", "n3"}
    assert got["n1"] == "n3" and got["n3"] == "n1"
    assert choose_partners(["n1"], {}) == {}  # one node: no partner, the tier says so
    assert choose_partners(["n1", "n2"], {}, bad={"n1", "n2"}) == {}


@settings(max_examples=examples(200), deadline=None)
@given(
    nodes=st.lists(st.sampled_from([f"n{i}" for i in range(12)]), min_size=2, max_size=12, unique=True),
    racks=st.dictionaries(st.sampled_from([f"n{i}" for i in range(12)]), st.sampled_from("ABC")),
    bad=st.sets(st.sampled_from([f"n{i}" for i in range(12)])),
)
def test_partner_choice_properties(nodes: list[str], racks: dict[str, str], bad: set[str]) -> None:
    got = choose_partners(nodes, racks, bad)
    fit = [n for n in nodes if n not in bad]
    for node, partner in got.items():
        assert partner != node and partner in fit  # never itself, never a sick node
        other_racks = [
            n for n in fit if n != node and (racks.get(node) is None or racks.get(n) != racks[node])
        ]
        if other_racks:  # another failure domain whenever the job has one
            assert racks.get(node) is None or racks.get(partner) != racks[node]
    assert set(got) == {n for n in nodes if any(m != n for m in fit)}
    loads = [list(got.values()).count(n) for n in fit]
    if not racks and loads:  # one domain: as even as possible
        assert max(loads) - min(loads) <= 1


def job_record(nodes: list[str]) -> JobRecord:
    record = JobRecord(id="j9")
    for index, node in enumerate(nodes):
        record.ranks_by_node[node] = [RankInfo(rank=index, local_rank=0, pid=100 + index)]
    return record


async def test_the_choice_is_sent_to_the_job_s_nodes_only_when_it_changes() -> None:
    sent: list[tuple[str, Directive]] = []

    async def publish(topic: str, payload: bytes, **_: object) -> None:
        sent.append((topic, decode(payload, Directive)))

    partners = CheckpointPartners(publish, {"n1": "A", "n2": "A", "n3": "B"})
    choice = await partners.check("j9", job_record(["n1", "n2", "n3"]), bad=set())
    assert choice == {"n1": "n3", "n2": "n3", "n3": "n1"}
    assert [t for t, _ in sent] == [f"ftd/v1/nodes/{n}/directives/jobs" for n in ("n1", "n2", "n3")]
    assert sent[0][1].action == "partners" and sent[0][1].params["partners"] == choice
    assert await partners.check("j9", job_record(["n1", "n2", "n3"]), bad=set()) == {}  # unchanged
    assert len(sent) == 3
    moved = await partners.check("j9", job_record(["n1", "n2", "n3"]), bad={"n3"})  # n3 fell sick
    assert moved == {"n1": "n2", "n2": "n1", "n3": "n1"} and len(sent) == 6
    versions = [d.params["version"] for _, d in sent]
    assert versions[0] < versions[3], "a newer choice has a greater version (the tier applies the newest)"
    # n3 recovers: the first choice again. Its directive must not reuse the first one's id, which the
    # agent would drop as seen (before, the id was the choice's checksum only).
    back = await partners.check("j9", job_record(["n1", "n2", "n3"]), bad=set())
    assert back == choice and len(sent) == 9
    assert sent[6][1].id != sent[0][1].id and sent[6][1].params["version"] > versions[3]


async def test_the_agent_hands_partners_to_ranks_as_the_protocol_op_also_to_later_ones(api: LocalApi) -> None:
    early = await Peer.open(api)
    await early.register("j9", 0)
    directive = Directive(
        id="partners-j9-1",
        ts=time.time(),
        action="partners",
        job="j9",
        params={"partners": {"n1": "n3", "n3": "n1"}, "generation": 2, "version": 11},
    )
    assert await api.deliver(directive) == 1
    want = {
        "v": 1,
        "op": "partners",
        "job": "j9",
        "partners": {"n1": "n3", "n3": "n1"},
        "generation": 2,
        "version": 11,
    }
    assert await early.recv() == want
    late = await Peer.open(api)
    await late.register("j9", 1)
    assert await late.recv() == want  # kept for a rank that registers later
    await early.close()
    await late.close()
