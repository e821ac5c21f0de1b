"""Peer naming end to end inside one process (issue #33): a log line that blames another rank by
address becomes an event carrying ``peer_address``; the node's status announces its addresses; the
coordinator's state resolves the address to the node (and rank) and keeps the job's recent blames;
the nccl_ib rule judges and targets the blamed node, not the reporter."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

from ftd.agent.addresses import discover, node_addresses
from ftd.agent.app import status_messages
from ftd.agent.watchers.logfile import LogWatcher
from ftd.config import AgentConfig, LogsConfig
from ftd.coordinator.model.state import PEER_BLAMES_KEPT
from ftd.events import Event, Kind, NodeStatus, decode, make_event
from ftd.rules import nccl_ib
from ftd.testing import evaluate_rule, view_with

pytestmark = pytest.mark.timeout(60)

GLOO_LINE = (
    "[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[10.0.0.2]:15243. This is typically caused by a remote worker crashing."
)


async def test_the_log_watcher_names_the_peer(tmp_path: Path) -> None:
    path, other = tmp_path / "rank0.log", tmp_path / "rank1.log"  # one event per (file, pattern) a while
    path.write_text("")
    other.write_text("")
    events: list[Event] = []

    async def emit(event: Event) -> None:
        events.append(event)

    watcher = LogWatcher(
        LogsConfig(paths=[str(tmp_path / "*.log")], rescan_s=0.05), "node-a", emit, use_inotify=False
    )
    task = asyncio.create_task(watcher.run())
    try:
        deadline = time.monotonic() + 30
        while len(watcher.followers) < 2:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        with path.open("a") as f:
            f.write("step 3 loss 0.2\n" + GLOO_LINE + "\n")
        with other.open("a") as f:
            f.write("n1:7:9 [0] misc/socket.cc:484 NCCL WARN Connect to 10.0.0.3<43210> failed : refused\n")
        while len(events) < 2:
            assert time.monotonic() < deadline, events
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert sorted((e.kind, e.data["pattern"], e.data.get("peer_address")) for e in events) == [
        (Kind.LOG_PATTERN, "peer_connection_lost", "10.0.0.2"),
        (Kind.LOG_PATTERN, "peer_connection_lost", "10.0.0.3"),
    ]


def test_the_birth_status_announces_the_addresses() -> None:
    will, birth = status_messages("node-b", "", ["10.0.0.2", "node-b"])
    assert decode(birth.payload, NodeStatus).addresses == ["10.0.0.2", "node-b"]
    assert decode(will.payload, NodeStatus).addresses == []


def test_addresses_configured_or_discovered() -> None:
    assert node_addresses(AgentConfig(addresses=["127.0.0.2", "127.0.0.2", "n2"])) == ["127.0.0.2", "n2"]
    found = node_addresses(AgentConfig())
    assert found == discover()
    assert not {"127.0.0.1", "::1", "localhost"} & set(found)
    assert all(not a.startswith("fe80:") for a in found)


def blame_event(node: str, address: str, job: str = "7", ts: float = 1000.0) -> Event:
    return make_event(
        node,
        Kind.LOG_PATTERN,
        severity="error",
        data={"pattern": "peer_connection_lost", "peer_address": address, "job": job, "text": GLOO_LINE},
        ts=ts,
    )


def test_the_state_resolves_blames_to_the_node_and_rank() -> None:
    state = view_with(jobs={"7": ["node-a", "node-b"]})
    state.apply_status(NodeStatus(node="node-b", state="online", addresses=["10.0.0.2", "node-b.cluster"]))
    state.apply_status(NodeStatus(node="node-b", state="offline"))  # the Will: the addresses stay
    assert state.node_of_address("10.0.0.2") == "node-b"
    assert state.node_of_address("node-b.cluster") == "node-b"
    assert state.node_of_address("10.0.0.9") is None
    state.apply_event(blame_event("node-a", "10.0.0.2"))
    (blame,) = state.job_peer_blames("7")
    assert (blame.reporter_node, blame.node, blame.rank, blame.address) == ("node-a", "node-b", 1, "10.0.0.2")
    assert blame.line.startswith("[rank0]: RuntimeError")
    for i in range(PEER_BLAMES_KEPT + 5):
        state.apply_event(blame_event("node-a", "10.0.0.2", ts=2000.0 + i))
    assert len(state.job_peer_blames("7")) == PEER_BLAMES_KEPT


def test_a_blame_recorded_before_the_node_announced_itself_is_resolved_later() -> None:
    state = view_with(jobs={"7": ["node-a", "node-b"]})
    state.apply_event(blame_event("node-a", "10.0.0.2"))
    assert state.job_peer_blames("7")[0].node is None
    state.apply_status(NodeStatus(node="node-b", state="online", addresses=["10.0.0.2"]))
    assert state.job_peer_blames("7")[0].node == "node-b"


def test_new_addresses_replace_the_old() -> None:
    state = view_with(jobs={"7": ["node-a", "node-b"]})
    state.apply_status(NodeStatus(node="node-b", state="online", addresses=["10.0.0.2"]))
    state.apply_status(NodeStatus(node="node-b", state="online", addresses=["10.0.0.22"]))
    assert state.node_of_address("10.0.0.2") is None
    assert state.node_of_address("10.0.0.22") == "node-b"


def ib_fatal(node: str, ts: float) -> Event:
    return make_event(node, Kind.LOG_PATTERN, severity="critical", data={"pattern": "ib_device_fatal"}, ts=ts)


def test_the_rule_drains_the_blamed_node_with_evidence_there_not_the_reporter() -> None:
    # before peer naming, the reporter (node-a, clean) was judged: a restart in place, node-b untouched
    view = view_with(jobs={"7": ["node-a", "node-b"]}, history=[ib_fatal("node-b", 900.0)])
    view.apply_status(NodeStatus(node="node-b", state="online", addresses=["10.0.0.2"]))
    actions = evaluate_rule(nccl_ib, blame_event("node-a", "10.0.0.2"), view)
    assert [(a.kind, a.target) for a in actions] == [("checkpoint_restart", "7"), ("drain_node", "node-b")]
    assert actions[0].params["exclude"] == ["node-b"] and actions[0].params["peer_node"] == "node-b"
    assert "naming node-b" in actions[1].reason


def test_without_evidence_the_restart_is_in_place_and_names_the_suspect() -> None:
    view = view_with(jobs={"7": ["node-a", "node-b"]})
    view.apply_status(NodeStatus(node="node-b", state="online", addresses=["10.0.0.2"]))
    actions = evaluate_rule(nccl_ib, blame_event("node-a", "10.0.0.2"), view)
    assert [(a.kind, a.target) for a in actions] == [("checkpoint_restart", "7")]
    assert actions[0].params["exclude"] == [] and actions[0].params["peer_node"] == "node-b"


def test_evidence_on_the_reporter_does_not_drain_it_when_the_line_blames_another() -> None:
    view = view_with(jobs={"7": ["node-a", "node-b"]}, history=[ib_fatal("node-a", 900.0)])
    view.apply_status(NodeStatus(node="node-b", state="online", addresses=["10.0.0.2"]))
    actions = evaluate_rule(nccl_ib, blame_event("node-a", "10.0.0.2"), view)
    assert "drain_node" not in [a.kind for a in actions]


def test_an_unknown_address_leaves_the_reporter_judged_as_before() -> None:
    view = view_with(jobs={"7": ["node-a", "node-b"]}, history=[ib_fatal("node-a", 900.0)])
    actions = evaluate_rule(nccl_ib, blame_event("node-a", "10.0.0.99"), view)
    assert [(a.kind, a.target) for a in actions] == [("checkpoint_restart", "7"), ("drain_node", "node-a")]
