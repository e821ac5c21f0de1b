"""diagnose_hang (issue #33): every node asked at once, real agents' evidence of real processes (one
SIGSTOPped, one waiting in a "barrier"), the verdict recorded and handed on as hang_verdict."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from ftd.agent.hang_evidence import collect_hang_evidence, evidence_ack, process_state
from ftd.bus import topics
from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.diagnose_hang import DiagnoseHang
from ftd.coordinator.actions.directive import node_sender
from ftd.coordinator.model.state import ClusterState
from ftd.events import Ack, Directive, Event, JobPresence, Kind, RankInfo, decode, encode
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState
from ftd.rules import hang
from ftd.testing import evaluate_rule, view_with

_WAITER = "import time\ndef barrier():\n    time.sleep(600)\ndef train():\n    barrier()\ntrain()\n"
_LOADER = "import time\ndef load_batch():\n    time.sleep(600)\ndef train():\n    load_batch()\ntrain()\n"


@pytest.fixture
def ranks() -> Iterator[dict[int, subprocess.Popen[bytes]]]:
    procs = {
        0: subprocess.Popen([sys.executable, "-c", _WAITER]),
        1: subprocess.Popen([sys.executable, "-c", _LOADER]),
    }
    for p in procs.values():
        end = time.monotonic() + 60
        while process_state(p.pid) != "sleeping" and time.monotonic() < end:
            time.sleep(0.05)
    yield procs
    for p in procs.values():
        p.kill()
        p.wait()


class Agents:
    """The bus and each node's agent: a directive runs the real collection, its Ack goes through the
    wire encoding to the ack book. A node not in ``placed`` stays silent."""

    def __init__(self, acks: AckBook, placed: dict[str, list[RankInfo]], out: Path) -> None:
        self.acks, self.placed, self.out = acks, placed, out
        self.sent: list[Directive] = []
        self.tasks: list[asyncio.Task[None]] = []

    async def publish(self, topic: str, payload: bytes) -> None:
        directive = decode(payload, Directive)
        self.sent.append(directive)
        node = topic.split("/")[3]
        if node in self.placed:
            self.tasks.append(asyncio.create_task(self._answer(node, directive)))

    async def _answer(self, node: str, directive: Directive) -> None:
        evidence = await collect_hang_evidence(
            directive, self.placed[node], self.out / node, node=node, ras_port=1
        )
        self.acks.record(decode(encode(evidence_ack(directive, node, evidence)), Ack))


def _state(nodes: dict[str, list[RankInfo]]) -> ClusterState:
    state = ClusterState()
    for node, infos in nodes.items():
        state.apply_presence(node, "j1", JobPresence(job="j1", node=node, ranks=infos))
    return state


def _record() -> ActionRecord:
    request = ActionRequest(
        kind=ActionKind.DIAGNOSE_HANG, target="j1", reason="hang suspected: rank 0 heartbeat lost"
    )
    return ActionRecord(id="act-9", request=request, state=ActionState.RUNNING)


async def test_stopped_rank_is_named_and_the_rule_excludes_only_its_node(
    tmp_path: Path, ranks: dict[int, subprocess.Popen[bytes]]
) -> None:
    placed = {
        "node-a": [RankInfo(rank=0, pid=ranks[0].pid, step=9, last_beat=time.time() - 40)],
        "node-b": [RankInfo(rank=1, pid=ranks[1].pid, step=9, last_beat=time.time() - 40)],
    }
    acks = AckBook()
    agents = Agents(acks, placed, tmp_path)
    emitted: list[Event] = []

    async def emit(event: Event) -> None:
        emitted.append(event)

    ex = DiagnoseHang(
        send=node_sender(agents.publish), state=_state(placed), acks=acks, deadline_s=8.0, emit=emit
    )
    os.kill(ranks[1].pid, signal.SIGSTOP)
    try:
        detail = await ex(_record())
    finally:
        os.kill(ranks[1].pid, signal.SIGCONT)
    assert sorted(d.node or "" for d in agents.sent) == ["node-a", "node-b"]
    assert {d.action for d in agents.sent} == {"collect_hang_evidence"}
    assert detail["unanswered"] == [] and "state" not in detail
    assert set(detail["node_evidence"]) == {"node-a", "node-b"}
    assert detail["node_evidence"]["node-b"]["ranks"][0]["state"] == "stopped"
    verdict = detail["verdict"]
    assert verdict["culprit_nodes"] == ["node-b"], verdict
    assert verdict["kind"] == "culprit" and verdict["confident"] is True
    assert {item["source"] for item in verdict["evidence"]} >= {"process_state"}
    assert "barrier" in detail["tree"] and "load_batch" in detail["tree"]
    [event] = emitted
    assert (event.kind, event.source, event.id) == (Kind.HANG_VERDICT, "coordinator", "act-9-verdict")
    assert event.data["culprit_nodes"] == ["node-b"] and event.data["action_id"] == "act-9"
    actions = evaluate_rule(hang, event, view_with(jobs={"j1": ["node-a", "node-b"]}))
    [restart] = [a for a in actions if a.kind == ActionKind.CHECKPOINT_RESTART]
    assert restart.params["exclude"] == ["node-b"] and restart.params["save"] is False
    [drain] = [a for a in actions if a.kind == ActionKind.DRAIN_NODE]
    assert drain.target == "node-b" and drain.params["suspect"] is True


async def test_a_silent_node_is_named_and_nothing_is_confident(
    tmp_path: Path, ranks: dict[int, subprocess.Popen[bytes]]
) -> None:
    placed = {
        "node-a": [RankInfo(rank=0, pid=ranks[0].pid)],
        "node-b": [RankInfo(rank=1, pid=ranks[1].pid)],
        "node-c": [RankInfo(rank=2, pid=None)],
    }
    acks = AckBook()
    agents = Agents(acks, {n: placed[n] for n in ("node-a", "node-b")}, tmp_path)
    ex = DiagnoseHang(send=node_sender(agents.publish), state=_state(placed), acks=acks, deadline_s=2.0)
    detail = await ex(_record())
    assert detail["unanswered"] == ["node-c"] and detail["state"] == "escalated"
    assert "node-c" in " ".join(detail["verdict"]["unanswered"])
    assert "no answer" in detail["refused"]["node-c"]


async def test_a_resumed_action_does_not_ask_again_and_bad_answers_are_refused(tmp_path: Path) -> None:
    acks = AckBook()
    placed = {"node-a": [RankInfo(rank=0, pid=None)]}
    sent: list[Directive] = []

    async def publish(topic: str, payload: bytes) -> None:
        directive = decode(payload, Directive)
        sent.append(directive)
        forged = Ack(
            directive_id=directive.id, job="j1", rank=-1, node="node-a", data={"evidence": {"node": "node-z"}}
        )
        asyncio.get_running_loop().call_later(0.01, acks.record, forged)

    ex = DiagnoseHang(send=node_sender(publish), state=_state(placed), acks=acks, deadline_s=2.0)
    record = _record()
    collected = await ex.run_phase(record, "collect")
    assert collected["unanswered"] == ["node-a"] and "not hang evidence" in collected["refused"]["node-a"]
    record.detail.update(collected)
    asked = len(sent)
    out = await ex.run_phase(record, "verdict")  # reads the collected detail, asks nobody
    assert len(sent) == asked and out["verdict"]["kind"] in ("unknown", "job_wide", "culprit")
    assert out["state"] == "escalated" and not out["verdict"]["confident"]
    assert topics.node_directives("node-a").endswith("node-a/directives")


def test_actions_show_renders_the_verdict_its_sources_and_the_tree() -> None:
    from ftd.commands.actions import render_show

    action = {
        "id": "act-9",
        "kind": "diagnose_hang",
        "target": "j1",
        "state": "succeeded",
        "rule": "hang",
        "reason": "hang suspected",
        "detail": {
            "phases_done": ["collect", "verdict"],
            "verdict": {
                "kind": "culprit",
                "confident": True,
                "why": "rank 1 on node-b is stopped",
                "culprit_nodes": ["node-b"],
                "culprit_ranks": [1],
                "evidence": [
                    {"source": "process_state", "says": "rank 1 is stopped", "node": "node-b", "rank": 1}
                ],
                "unanswered": [],
            },
            "tree": "train (t.py)  [2] ranks 0-1\n  barrier (t.py)  [1] rank 0",
            "node_evidence": {
                "node-b": {"path": "/var/lib/ftd/diagnostics/act-9", "ranks": [{"files": ["a", "b"]}]}
            },
        },
    }
    text = render_show(action, None)
    assert "VERDICT" in text and "culprit (confident): rank 1 on node-b is stopped" in text
    assert "[process_state] against node node-b rank 1: rank 1 is stopped" in text
    assert "raw files on node-b: /var/lib/ftd/diagnostics/act-9 (2 files)" in text
    assert "    barrier (t.py)  [1] rank 0" in text
    assert "VERDICT" not in render_show({**action, "kind": "notify", "detail": {}}, None)


async def test_the_loop_serves_other_work_while_a_big_verdict_is_drawn() -> None:
    """Decoding and fusing the evidence runs in a worker thread (issue #33: collection never blocks
    the coordinator's event loop). 32 ranks of 4 threads of 3,000 frames each: on the loop, a ticker
    beside it would not run once between the verdict's start and end."""
    from ftd.culprit.evidence import Frame, NodeEvidence, RankEvidence, ThreadStack

    def rank(r: int) -> RankEvidence:
        frames = [Frame(function=f"f{i % 97}", file=f"m{i % 13}.py", line=i) for i in range(3000)]
        threads = [ThreadStack(thread=str(t), frames=frames, main=t == 0) for t in range(4)]
        return RankEvidence(rank=r, node=f"node-{r // 8}", pid=1000 + r, state="sleeping", stacks=threads)

    nodes = {
        f"node-{n}": NodeEvidence(
            node=f"node-{n}", job="j1", ranks=[rank(r) for r in range(n * 8, n * 8 + 8)]
        )
        for n in range(4)
    }
    placed = {n: [RankInfo(rank=r.rank, pid=r.pid) for r in e.ranks] for n, e in nodes.items()}
    ex = DiagnoseHang(send=node_sender(_no_bus), state=_state(placed), acks=AckBook(), deadline_s=2.0)
    record = _record()
    record.detail["node_evidence"] = {n: msgspec.to_builtins(e) for n, e in nodes.items()}
    record.detail["expected"] = {n: [r.rank for r in e.ranks] for n, e in nodes.items()}
    record.detail["unanswered"] = []
    ticks = 0
    drawing = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        await drawing.wait()
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    drawing.set()
    await asyncio.sleep(0)  # the ticker is waiting on the loop
    before = ticks
    out = await ex.run_phase(record, "verdict")
    during = ticks - before
    task.cancel()
    assert out["verdict"]["kind"] in ("job_wide", "unknown", "culprit") and "f0" in out["tree"]
    assert during >= 3, f"the ticker ran {during} times while the verdict was drawn"


async def _no_bus(topic: str, payload: bytes) -> None:
    raise AssertionError(f"the verdict phase asks nobody ({topic})")
