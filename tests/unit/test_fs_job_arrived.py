"""A job (re)started onto a still-full filesystem is moved off it (issue #10, filesystem).

The fs watcher reports a level only when it changes, so a job requeued onto a node whose checkpoint
mount is still critical used to run there unprotected until the next crossing. Now the agent tells
the watcher when a job arrives, the watcher repeats the critical level naming the job, and the
fs_fill rule moves that job (and only that job) off the node.
"""

from __future__ import annotations

from pathlib import Path

from ftd.agent.wiring import build_agent
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import AgentConfig
from ftd.events import Kind, RankInfo, Severity
from ftd.plugin import ActionKind
from ftd.rules import fs_fill
from ftd.testing import evaluate_rule, make_event, view_with
from tests.unit.test_watcher_fs import Fake, watcher


async def test_the_watcher_repeats_a_critical_level_for_a_job_that_arrives() -> None:
    fake = Fake()
    w = watcher(fake, warn_pct=80, critical_pct=90)
    fake.vfs.fill(50)
    await w.poll_once()
    assert await w.job_arrived("j7") == 0 and fake.events == []  # nothing to say on a healthy disk
    fake.vfs.fill(95)
    fake.now += 3600
    await w.poll_once()
    assert await w.job_arrived("j7") == 1
    crossing, arrived = fake.events
    assert crossing.data["reason"] == "threshold"
    assert (arrived.kind, arrived.severity) == (Kind.FS_FILL, Severity.CRITICAL)
    what = (arrived.data["reason"], arrived.data["job"], arrived.data["level"])
    assert what == ("job_arrived", "j7", "critical")
    assert arrived.data["used_pct"] == crossing.data["used_pct"] and arrived.data["path"] == "/ckpt"


def test_the_rule_moves_only_the_arriving_job_off_the_node() -> None:
    view = view_with(jobs={"old": ["node-a"], "j7": ["node-a", "node-b"]})
    data = {"path": "/ckpt", "reason": "job_arrived", "level": "critical", "job": "j7", "used_pct": 95.0}
    event = make_event("node-a", Kind.FS_FILL, severity="critical", source="fs", data=data)
    actions = evaluate_rule(fs_fill, event, view)
    restarts = [a for a in actions if a.kind == ActionKind.CHECKPOINT_RESTART]
    assert [(a.target, a.params["exclude"]) for a in restarts] == [("j7", ["node-a"])]
    assert "job j7 started on it" in restarts[0].reason


async def test_the_agent_tells_the_watcher_once_per_arrival(tmp_path: Path) -> None:
    (tmp_path / "kmsg").touch()
    cfg = AgentConfig(
        node="node-a",
        kmsg_path=str(tmp_path / "kmsg"),
        state_dir=str(tmp_path / "s"),
        socket_path=str(tmp_path / "a.sock"),
    )
    fake = Fake()
    fs = watcher(fake, warn_pct=80, critical_pct=90)
    agent = build_agent(cfg, bus=MemoryBus(MemoryBroker()), watchers=[fs])
    fake.vfs.fill(95)
    await fs.poll_once()
    await agent.hooks.presence("j7", [RankInfo(rank=0)])
    await agent.hooks.presence("j7", [RankInfo(rank=0), RankInfo(rank=1)])  # a second rank: same job
    await agent.hooks.presence("j7", [])  # it left ...
    await agent.hooks.presence("j7", [RankInfo(rank=0)])  # ... and was requeued onto the same node
    arrivals = [e.data["job"] for e in fake.events if e.data.get("reason") == "job_arrived"]
    assert arrivals == ["j7", "j7"]
