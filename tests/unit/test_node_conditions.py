"""ftd's view as a Kubernetes node condition, NPD-style (issue #12): a real :class:`Agent` (in-memory bus,
a kernel-log file) writes ``FtdProblem`` to its Node's status through the fake kube-apiserver
(tests/fakes/kube_api.py: strategic merge by condition type, bearer token checked). An Xid 79 turns it
True with the reason; a reset of that GPU turns it back False (lastTransitionTime moves, the kubelet's
Ready condition is untouched); an API error is counted and retried, never fatal."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ftd.agent.wiring import build_agent
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import AgentConfig
from ftd.config.schema import AgentKubernetesConfig
from ftd.events import Kind, make_event
from tests.fakes.kube_api import FakeKubeApi
from tests.unit.helpers import until

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus."


@pytest.fixture
async def kube() -> AsyncIterator[FakeKubeApi]:
    api = FakeKubeApi()
    api.add_node("gpu-1")
    await api.start()
    try:
        yield api
    finally:
        await api.stop()


def ftd_condition(kube: FakeKubeApi) -> dict[str, Any] | None:
    conds = kube.nodes["gpu-1"]["status"]["conditions"]
    return next((c for c in conds if c["type"] == "FtdProblem"), None)


async def test_the_agent_writes_its_view_as_a_node_condition(kube: FakeKubeApi, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(kube.token + "\n")
    kmsg = tmp_path / "kmsg"
    kmsg.touch()
    cfg = AgentConfig(
        node="gpu-1",
        kmsg_path=str(kmsg),
        kmsg_from_start=True,
        state_dir=str(tmp_path / "state"),
        socket_path=str(tmp_path / "a.sock"),
        kubernetes=AgentKubernetesConfig(
            node_conditions=True, host=kube.url, token_file=str(token), ca_file=None, resync_s=30
        ),
    )
    agent = build_agent(cfg, bus=MemoryBus(MemoryBroker(), client_id="agent"))
    task = asyncio.create_task(agent.run())
    try:
        await until(lambda: ftd_condition(kube) is not None, 10)
        first = ftd_condition(kube)
        assert first is not None and (first["status"], first["reason"]) == ("False", "FtdHealthy")
        kmsg.write_text(XID79 + "\n")
        await until(lambda: (ftd_condition(kube) or {}).get("status") == "True", 10)
        bad = ftd_condition(kube)
        assert bad is not None and bad["reason"] == "Xid"
        assert bad["message"].startswith("xid 79 on 0000:3b:00")
        assert bad["lastTransitionTime"] >= first["lastTransitionTime"]
        reset = make_event(
            "gpu-1",
            Kind.GPU_HEALTH,
            severity="info",
            source="gpu_reset",
            data={"result": "reset_ok", "pci": "0000:3b:00.0"},
        )
        await agent.emit(reset)
        await until(lambda: (ftd_condition(kube) or {}).get("status") == "False", 10)
        conds = kube.nodes["gpu-1"]["status"]["conditions"]
        assert [c["type"] for c in conds] == ["Ready", "FtdProblem"]  # the kubelet's condition is kept
        patches = [r for r in kube.calls("PATCH") if r.path == "/api/v1/nodes/gpu-1/status"]
        assert all(r.content_type == "application/strategic-merge-patch+json" for r in patches)
        assert agent.node_conditions is not None and agent.node_conditions.errors == 0
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_an_api_error_is_counted_and_retried(kube: FakeKubeApi, tmp_path: Path) -> None:
    from ftd.agent.conditions import ConditionBook
    from ftd.agent.node_conditions import NodeConditionWriter

    token = tmp_path / "token"
    token.write_text("wrong-token")
    cfg = AgentKubernetesConfig(node_conditions=True, host=kube.url, token_file=str(token), ca_file=None)
    writer = NodeConditionWriter(cfg, "gpu-1", ConditionBook(None, boot="b"))
    assert await writer.write() is False and writer.errors == 1
    token.write_text(kube.token)  # a rotated token is read again
    assert await writer.write() is True and writer.writes == 1
    missing = NodeConditionWriter(cfg, "no-such-node", ConditionBook(None, boot="b"))
    assert await missing.write() is False
