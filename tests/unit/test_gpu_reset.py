"""GPU reset: never while a process holds the GPU; answered as an event and an Ack (fake nvidia-smi)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from ftd.agent.gpu_reset import GpuResetter
from ftd.agent.wiring import build_agent
from ftd.bus import topics
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import AgentConfig
from ftd.events import Ack, Directive, Event, decode, encode

GPUS = "0, 00000000:3B:00.0, GPU-aaa\n1, 00000000:86:00.0, GPU-bbb\n"


class FakeSmi:
    def __init__(self, apps: str = "", reset_rc: int = 0, gpus_after: str = GPUS, apps_rc: int = 0) -> None:
        self.apps, self.reset_rc, self.gpus_after, self.apps_rc = apps, reset_rc, gpus_after, apps_rc
        self.calls: list[list[str]] = []
        self.resets = 0

    async def __call__(self, argv: list[str]) -> tuple[int, str]:
        self.calls.append(argv)
        if argv[1].startswith("--query-gpu"):
            return 0, self.gpus_after if self.resets else GPUS
        if argv[1].startswith("--query-compute-apps"):
            return self.apps_rc, self.apps
        if argv[1] == "-r":
            self.resets += 1
            return (
                self.reset_rc,
                "GPU 00000000:3B:00.0 was successfully reset." if self.reset_rc == 0 else "busy",
            )
        raise AssertionError(argv)


def directive(**params: object) -> Directive:
    return Directive(id="d1", ts=1.0, action="gpu_reset", node="n1", params=dict(params))


async def test_refuses_while_a_process_holds_the_gpu() -> None:
    smi = FakeSmi(apps="4242, GPU-aaa\n")
    result = await GpuResetter("n1", runner=smi).reset(directive(pci="0000:3b:00.0"))
    assert result.result == "refused" and "4242" in result.reason
    assert smi.resets == 0


async def test_refuses_when_processes_cannot_be_listed() -> None:
    smi = FakeSmi(apps_rc=9, apps="NVML error")
    result = await GpuResetter("n1", runner=smi).reset(directive(index=0))
    assert result.result == "refused" and smi.resets == 0


async def test_resets_an_idle_gpu_other_gpus_processes_do_not_matter() -> None:
    smi = FakeSmi(apps="4242, GPU-bbb\n")
    result = await GpuResetter("n1", runner=smi).reset(directive(uuid="GPU-aaa"))
    assert result.result == "reset_ok" and smi.resets == 1
    assert ["nvidia-smi", "-r", "-i", "0000:3b:00.0"] in smi.calls


async def test_failed_reset_and_missing_gpu_after_reset_are_failures() -> None:
    failed = await GpuResetter("n1", runner=FakeSmi(reset_rc=1)).reset(directive(index=0))
    assert failed.result == "failed" and "busy" in failed.reason
    gone = await GpuResetter("n1", runner=FakeSmi(gpus_after="1, 00000000:86:00.0, GPU-bbb\n")).reset(
        directive(index=0)
    )
    assert gone.result == "failed" and "not listed" in gone.reason
    unknown = await GpuResetter("n1", runner=FakeSmi()).reset(directive(pci="0000:99:00.0"))
    assert unknown.result == "failed"


async def test_duplicate_directive_does_not_reset_twice() -> None:
    smi = FakeSmi()
    resetter = GpuResetter("n1", runner=smi)
    first, second = await asyncio.gather(
        resetter.reset(directive(index=0)), resetter.reset(directive(index=0))
    )
    assert first is second and smi.resets == 1


async def test_agent_answers_a_node_directive_with_an_ack_and_a_gpu_health_event(tmp_path: Path) -> None:
    (tmp_path / "kmsg").touch()
    cfg = AgentConfig(
        node="n1",
        kmsg_path=str(tmp_path / "kmsg"),
        state_dir=str(tmp_path / "s"),
        socket_path=str(tmp_path / "a.sock"),
    )
    broker = MemoryBroker()
    coordinator = MemoryBus(broker, client_id="coordinator")
    await coordinator.subscribe(topics.node_acks("n1"))
    await coordinator.subscribe(topics.node_event("n1", "gpu_health"))
    await coordinator.start()
    agent = build_agent(
        cfg, bus=MemoryBus(broker, client_id="agent"), node="n1", gpu_runner=FakeSmi(apps="7, GPU-aaa\n")
    )
    task = asyncio.create_task(agent.run())
    try:
        await agent.bus.wait_connected(5)
        await asyncio.sleep(0.05)
        await coordinator.publish(topics.node_directives("n1"), encode(directive(pci="0000:3b:00.0")))
        got: dict[str, bytes] = {}
        async with asyncio.timeout(5):
            async for message in coordinator.messages():
                got[message.topic.rsplit("/", 1)[-1]] = message.payload
                if len(got) == 2:
                    break
        ack = decode(got["acks"], Ack)
        assert ack.directive_id == "d1" and not ack.ok and ack.reason.startswith("refused")
        event = decode(got["gpu_health"], Event)
        assert event.data["result"] == "refused" and event.data["directive_id"] == "d1"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
