"""The verdict drawn from a job's hang evidence, built from real py-spy and flight-recorder dumps
(tests/unit/culprit_dumps/): a SIGSTOPped rank, a rank stuck before the collective, every rank blocked
reading a FIFO, everyone in the same collective, conflicts, weak evidence only, and odd evidence."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as hs

from ftd.culprit.evidence import (
    FlightRecord,
    JobEvidence,
    NodeEvidence,
    PeerBlame,
    ProcessState,
    RankEvidence,
    RasStatus,
    ThreadStack,
)
from ftd.culprit.flight import parse_flight_json
from ftd.culprit.stacks import parse_py_spy
from ftd.culprit.verdict import fuse
from tests.properties import examples

DUMPS = Path(__file__).with_name("culprit_dumps")


@cache
def stacks(name: str) -> list[ThreadStack]:
    threads, problems = parse_py_spy((DUMPS / name).read_text())
    assert problems == []
    return threads


@cache
def flight(name: str) -> FlightRecord:
    record, error = parse_flight_json((DUMPS / name).read_bytes())
    assert record is not None, error
    return record


WAITING = "r0.txt"  # in all_reduce
BEFORE = "r2.txt"  # in load_batch, before the collective
FIFO = "fifo.txt"  # reading a FIFO nobody writes


def job(
    layout: dict[str, list[int]],
    *,
    dumps: dict[int, str | None] | None = None,
    states: dict[int, ProcessState] | None = None,
    flights: dict[int, str] | None = None,
    unanswered: list[str] = (),  # type: ignore[assignment]
    blames: list[PeerBlame] = (),  # type: ignore[assignment]
    ras: dict[str, RasStatus] | None = None,
    errors: dict[int, dict[str, str]] | None = None,
    beats: dict[int, float] | None = None,
) -> JobEvidence:
    """A job on ``layout`` (node -> ranks); every rank of an answering node is sleeping in all_reduce
    unless told otherwise."""
    dumps, states, flights, errors = dumps or {}, states or {}, flights or {}, errors or {}
    nodes = {}
    for node, ranks in layout.items():
        if node in unanswered:
            continue
        evidence = []
        for rank in ranks:
            dump = dumps.get(rank, WAITING)
            evidence.append(
                RankEvidence(
                    rank=rank,
                    node=node,
                    pid=1000 + rank,
                    state=states.get(rank, "sleeping"),
                    stacks=stacks(dump) if dump else [],
                    flight=flight(flights[rank]) if rank in flights else None,
                    errors=errors.get(rank, {}),
                    beat_age_s=(beats or {}).get(rank),
                )
            )
        nodes[node] = NodeEvidence(node=node, job="7", ranks=evidence, ras=(ras or {}).get(node))
    return JobEvidence(
        job="7", expected=layout, nodes=nodes, unanswered_nodes=list(unanswered), peer_blames=list(blames)
    )


TWO_NODES = {"node-a": [0, 1], "node-b": [2, 3]}
FOUR_NODES = {"node-a": [0, 1], "node-b": [2, 3], "node-c": [4, 5], "node-d": [6, 7]}


def test_a_sigstopped_rank_is_the_culprit_with_confidence() -> None:
    verdict = fuse(
        job(
            TWO_NODES,
            dumps={3: None},
            states={3: "stopped"},
            errors={3: {"stacks": "py-spy timed out on a stopped process"}},
        )
    )
    assert (verdict.kind, verdict.confident) == ("culprit", True)
    assert verdict.culprit_ranks == [3] and verdict.culprit_nodes == ["node-b"]
    assert "rank 3 on node-b is stopped" in verdict.why
    assert {(e.source, e.rank) for e in verdict.evidence if e.against} >= {("process_state", 3)}
    assert verdict.errors == ["node-b rank 3: stacks: py-spy timed out on a stopped process"]
    assert verdict.tree is not None and [c.ranks for c in verdict.tree.children][-1] == [3]


def test_a_stopped_ranks_silent_heartbeat_agrees() -> None:
    beats = {0: 0.4, 1: 0.3, 2: 0.5, 3: 95.0}
    verdict = fuse(job(TWO_NODES, dumps={3: None}, states={3: "stopped"}, beats=beats))
    assert (verdict.kind, verdict.confident, verdict.culprit_ranks) == ("culprit", True, [3])
    assert {e.source for e in verdict.evidence if e.against} == {"process_state", "heartbeat"}


def test_a_silent_heartbeat_alone_is_weak() -> None:
    verdict = fuse(job(TWO_NODES, beats={0: 0.4, 1: 0.3, 2: 0.5, 3: 95.0}))
    assert (verdict.kind, verdict.confident, verdict.culprit_ranks) == ("culprit", False, [3])
    assert fuse(job(TWO_NODES, beats={0: 30.0, 1: 31.0, 2: 29.0, 3: 35.0})).kind == "unknown"


def test_a_rank_stuck_before_the_collective_is_named_by_stacks_and_flight_recorder() -> None:
    verdict = fuse(
        job(
            {"node-a": [0], "node-b": [1], "node-c": [2]},
            dumps={2: BEFORE},
            flights={
                0: "flight_gloo_r0_waiting.json",
                1: "flight_gloo_r0_waiting.json",
                2: "flight_gloo_r1_behind.json",
            },
        )
    )
    assert (verdict.kind, verdict.confident) == ("culprit", True)
    assert verdict.culprit_ranks == [2] and verdict.culprit_nodes == ["node-c"]
    sources = {e.source for e in verdict.evidence if e.against}
    assert sources == {"stacks", "flight_recorder"}
    assert "behind in the collective sequence" in verdict.why and "confirmed by the stacks" in verdict.why
    assert any(e.source == "stacks" and "load_batch (train.py)" in e.says for e in verdict.evidence)
    assert any(not e.against and e.source == "stacks" for e in verdict.evidence)  # the others cleared


def test_most_ranks_behind_one_is_only_weak() -> None:
    flights = {
        0: "flight_gloo_r0_waiting.json",
        1: "flight_gloo_r1_behind.json",
        2: "flight_gloo_r1_behind.json",
    }
    verdict = fuse(job({"node-a": [0, 1, 2]}, flights=flights))
    assert (verdict.kind, verdict.confident, verdict.culprit_ranks) == ("culprit", False, [1, 2])


def test_two_ranks_one_in_one_out_is_enough() -> None:
    verdict = fuse(job({"node-a": [0], "node-b": [1]}, dumps={1: BEFORE}))
    assert (verdict.kind, verdict.confident, verdict.culprit_nodes) == ("culprit", True, ["node-b"])


def test_every_rank_reading_the_same_fifo_is_job_wide() -> None:
    verdict = fuse(job(TWO_NODES, dumps=dict.fromkeys(range(4), FIFO)))
    assert (verdict.kind, verdict.confident) == ("job_wide", True)
    assert verdict.culprit_nodes == [] and "main_wait (fifo_reader.py)" in verdict.why


def test_everyone_in_the_same_collective_is_unknown() -> None:
    flights = dict.fromkeys(range(4), "flight_gloo_r0_waiting.json")
    verdict = fuse(job(TWO_NODES, flights=flights))
    assert (verdict.kind, verdict.confident) == ("unknown", False)
    assert "same collective" in verdict.why
    assert verdict.culprit_ranks == [] and verdict.culprit_nodes == []


def test_everyone_in_the_same_collective_with_ras_naming_a_rank_is_weak() -> None:
    ras = {"node-a": RasStatus(answered=True, missing_ranks=[2])}
    verdict = fuse(job(TWO_NODES, ras=ras))
    assert (verdict.kind, verdict.confident, verdict.culprit_ranks) == ("culprit", False, [2])


def test_sources_that_disagree_give_unknown_and_keep_every_claim() -> None:
    verdict = fuse(
        job(
            {"node-a": [0], "node-b": [1], "node-c": [2]},
            dumps={2: BEFORE},
            flights={
                0: "flight_gloo_r0_waiting.json",
                1: "flight_gloo_r1_behind.json",
                2: "flight_gloo_r0_waiting.json",
            },
        )
    )
    assert (verdict.kind, verdict.confident) == ("unknown", False)
    claims = {(e.source, e.rank) for e in verdict.evidence if e.against}
    assert claims == {("stacks", 2), ("flight_recorder", 1)}
    assert "disagree" in verdict.why


def test_a_node_that_does_not_answer_is_evidence_but_not_confidence() -> None:
    verdict = fuse(job(TWO_NODES, unanswered=["node-b"]))
    assert (verdict.kind, verdict.confident, verdict.culprit_nodes) == ("culprit", False, ["node-b"])
    assert verdict.unanswered == ["node-b"]


def test_a_silent_node_next_to_a_culprit_elsewhere_is_a_conflict() -> None:
    layout = {"node-a": [0], "node-b": [1], "node-c": [2]}
    verdict = fuse(job(layout, dumps={1: BEFORE}, unanswered=["node-c"]))
    assert (verdict.kind, verdict.confident) == ("unknown", False)
    assert verdict.unanswered == ["node-c"]


def test_peer_blames_agreeing_with_the_stacks() -> None:
    blame = PeerBlame(address="10.0.0.2", reporter_node="node-a", reporter_rank=0, node="node-b", rank=2)
    verdict = fuse(job(TWO_NODES, dumps={2: BEFORE}, states={}, blames=[blame]))
    assert (verdict.kind, verdict.confident, verdict.culprit_ranks) == ("culprit", True, [2])
    assert {e.source for e in verdict.evidence if e.against} == {"stacks", "peer_error"}


def test_a_peer_blame_alone_names_the_node_not_the_reporter_weakly() -> None:
    blame = PeerBlame(address="10.0.0.2", reporter_node="node-a", reporter_rank=0, node="node-b")
    verdict = fuse(job(TWO_NODES, blames=[blame]))
    assert (verdict.kind, verdict.confident, verdict.culprit_nodes) == ("culprit", False, ["node-b"])
    assert verdict.culprit_ranks == []


def test_culprits_over_more_than_half_the_nodes_are_no_node_fault() -> None:
    dumps = {1: BEFORE, 3: BEFORE, 5: BEFORE}
    verdict = fuse(job(FOUR_NODES, dumps=dumps))
    assert verdict.kind == "unknown" and not verdict.confident and verdict.culprit_nodes == []
    assert "no node fault" in verdict.why


def test_a_zombie_among_ranks_outside_any_collective_is_only_weak() -> None:
    verdict = fuse(job(TWO_NODES, dumps={0: FIFO, 1: FIFO, 2: FIFO, 3: None}, states={3: "zombie"}))
    assert not verdict.confident


def test_no_evidence_at_all() -> None:
    verdict = fuse(JobEvidence(job="7", expected={}, nodes={}))
    assert (verdict.kind, verdict.confident) == ("unknown", False)


dump_choice = hs.sampled_from([WAITING, BEFORE, FIFO, "r0.native.txt", "fifo.native.json", None])
state_choice = hs.sampled_from(["running", "sleeping", "disk", "stopped", "zombie", "gone", "unknown"])
flight_choice = hs.sampled_from([None, "flight_gloo_r0_waiting.json", "flight_gloo_r1_behind.json"])


@settings(max_examples=examples(300))
@given(
    hs.integers(1, 4),
    hs.integers(1, 3),
    hs.data(),
)
def test_any_mix_of_evidence_gives_a_sound_verdict(n_nodes: int, per_node: int, data: hs.DataObject) -> None:
    layout = {f"n{i}": [i * per_node + j for j in range(per_node)] for i in range(n_nodes)}
    ranks = [r for rs in layout.values() for r in rs]
    dumps = {r: data.draw(dump_choice) for r in ranks}
    states = {r: data.draw(state_choice) for r in ranks}
    flights = {r: f for r in ranks if (f := data.draw(flight_choice)) is not None}
    unanswered = data.draw(hs.lists(hs.sampled_from(sorted(layout)), unique=True, max_size=n_nodes))
    verdict = fuse(job(layout, dumps=dumps, states=states, flights=flights, unanswered=unanswered))
    assert verdict.errors == [] and verdict.why.endswith(".")
    assert set(verdict.culprit_nodes) <= set(layout)
    if verdict.kind != "culprit":
        assert verdict.culprit_nodes == []
    if verdict.confident and verdict.kind == "culprit":
        assert len(verdict.culprit_nodes) == 1 or len(verdict.culprit_nodes) * 2 <= n_nodes
        assert any(e.source in {"process_state", "flight_recorder", "stacks"} for e in verdict.evidence)


def _in_barrier(evidence: JobEvidence, rank: int) -> JobEvidence:
    """``evidence`` with ``rank`` waiting in ``barrier`` instead of ``all_reduce``."""
    nodes = {}
    for name, node in evidence.nodes.items():
        ranks = []
        for r in node.ranks:
            if r.rank == rank:
                threads = [
                    msgspec.structs.replace(
                        t,
                        frames=[
                            msgspec.structs.replace(f, function="barrier")
                            if f.function == "all_reduce"
                            else f
                            for f in t.frames
                        ],
                    )
                    for t in r.stacks
                ]
                r = msgspec.structs.replace(r, stacks=threads)
            ranks.append(r)
        nodes[name] = msgspec.structs.replace(node, ranks=ranks)
    return msgspec.structs.replace(evidence, nodes=nodes)


def test_a_stopped_ranks_frozen_stack_does_not_count_among_the_waiting() -> None:
    # CI, 2026-12-04: rank 2 SIGSTOPped inside all_reduce, rank 1 waits in the same all_reduce, and
    # rank 0 -- whose part of the ring had completed -- already waits in the next collective. The
    # stopped rank's frozen stack made rank 1 a majority and rank 0 "in another collective", a weak
    # claim that contradicted the process state: unknown, and the node was not excluded.
    layout = {"node-1": [0], "node-2": [1], "node-3": [2]}
    verdict = fuse(_in_barrier(job(layout, states={2: "stopped"}), 0))
    assert (verdict.kind, verdict.confident, verdict.culprit_ranks) == ("culprit", True, [2])
    assert verdict.culprit_nodes == ["node-3"]
    # ranks that are all alive keep the claim: one of three in another collective is still said
    alive = fuse(_in_barrier(job(layout), 0))
    assert (alive.kind, alive.confident, alive.culprit_ranks) == ("culprit", False, [0])
