"""Sequenced remediation (issue #10 item 4): save -> ack -> stop -> GPU reset -> requeue, as one plan.

The real coordinator (engine, built-in executors, ledger) and the real agent (its GPU reset refusal
logic, :mod:`ftd.agent.gpu_reset`, behind a fake ``nvidia-smi``) on the in-memory bus, a fake
scheduler, and a real trainer client on the agent's unix socket. The rule is the one the issue
quotes: ``[checkpoint_restart(job, exclude=node), gpu_reset(node, pci)]``. Before plans, the engine
ran both at once: the reset reached the agent while the trainer still held the GPU, the agent
refused, and nothing retried (the reset never happened).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftd.agent.app import Agent
from ftd.agent.wiring import build_agent
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.client import Client
from ftd.config import AgentConfig, ApiConfig, Config, CoordinatorConfig
from ftd.coordinator.actions.scheduler import FakeScheduler
from ftd.coordinator.daemon import Coordinator
from ftd.coordinator.decide.plugins import DEFAULT_RULES, default_rule_name
from ftd.coordinator.ledger.sqlite import Ledger
from ftd.coordinator.wiring import build
from ftd.events import Kind, make_event
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState
from ftd.plugin.hookspecs import hookimpl
from ftd.plugin.view import ClusterView
from tests.unit.helpers import until

GPUS = "0, 00000000:3B:00.0, GPU-aaa\n1, 00000000:86:00.0, GPU-bbb\n"
JOB, NODE, PCI = "1001", "node-1", "0000:3b:00.0"


@dataclass
class Timeline:
    """What happened, in order, across the trainer thread, the fake GPU and the fake scheduler."""

    entries: list[tuple[float, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, what: str) -> None:
        with self.lock:
            self.entries.append((time.monotonic(), what))

    def names(self) -> list[str]:
        with self.lock:
            return [w for _, w in self.entries]


class HeldGpu:
    """A fake ``nvidia-smi``: GPU-aaa is held by the trainer's pid while ``held`` is set."""

    def __init__(self, timeline: Timeline, fail_reset: bool = False) -> None:
        self.timeline = timeline
        self.held = threading.Event()
        self.fail_reset = fail_reset
        self.refusals = 0
        self.resets = 0
        self.checks = 0

    async def __call__(self, argv: list[str]) -> tuple[int, str]:
        if argv[1].startswith("--query-gpu"):
            self.checks += 1
            return 0, GPUS
        if argv[1].startswith("--query-compute-apps"):
            if self.held.is_set():
                self.refusals += 1
                self.timeline.add("reset_refused")
                return 0, "4242, GPU-aaa\n"
            return 0, ""
        if argv[1] == "-r":
            self.resets += 1
            self.timeline.add("reset")
            if self.fail_reset:
                return 1, "GPU is stuck"
            return 0, "GPU 00000000:3B:00.0 was successfully reset."
        raise AssertionError(argv)


class TimedScheduler(FakeScheduler):
    timeline: Timeline | None = None

    async def requeue(self, job: str, exclude: Sequence[str] = ()) -> None:
        assert self.timeline is not None
        self.timeline.add("requeue")
        await super().requeue(job, exclude)


class ResetAfterXid48:
    """The rule of the issue: save and stop the node's jobs (excluding the node), reset the GPU."""

    @hookimpl
    def ftd_evaluate(self, event: Any, view: ClusterView) -> list[ActionRequest] | None:
        if event.kind != Kind.XID or event.data.get("code") != 48:
            return None
        reason = f"xid 48 gpu {event.data['pci']}"
        restarts = [
            ActionRequest(
                kind=ActionKind.CHECKPOINT_RESTART,
                target=job,
                reason=reason,
                params={"exclude": [event.node], "node": event.node},
            )
            for job in view.jobs_on_node(event.node)
        ]
        reset = ActionRequest(
            kind=ActionKind.GPU_RESET, target=event.node, reason=reason, params={"pci": PCI}
        )
        return [*restarts, reset]


def trainer(socket_path: str, gpu: HeldGpu, timeline: Timeline, release_after_s: float) -> threading.Thread:
    """A training loop on the real client: saves when asked, acks, stops; its process keeps the GPU
    ``release_after_s`` after it left the agent (a rank tearing down its CUDA context)."""

    def run() -> None:
        gpu.held.set()
        client = Client(job=JOB, rank=0, socket_path=socket_path, heartbeat_interval=0.02)
        step = 0
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                step += 1
                client.heartbeat(step)
                time.sleep(0.01)
                if client.should_save():
                    client.ack_saved(step, f"/ckpt/{step}")
                    timeline.add("ack")
                if client.should_stop():
                    timeline.add("stopped")
                    break
        finally:
            client.close()
            time.sleep(release_after_s)
            gpu.held.clear()
            timeline.add("gpu_released")

    thread = threading.Thread(target=run, name="trainer", daemon=True)
    thread.start()
    return thread


@dataclass
class Cluster:
    coordinator: Coordinator
    ledger: Ledger  # the coordinator's, read synchronously by the test
    agent: Agent
    scheduler: TimedScheduler
    gpu: HeldGpu
    timeline: Timeline
    socket_path: str


@contextlib.asynccontextmanager
async def cluster(tmp_path: Path, *, fail_reset: bool = False, **coordinator: Any) -> AsyncIterator[Cluster]:
    timeline = Timeline()
    gpu = HeldGpu(timeline, fail_reset=fail_reset)
    scheduler = TimedScheduler()
    scheduler.timeline = timeline
    scheduler.add_job(JOB, [NODE])
    run_dir = tempfile.mkdtemp(prefix="ftd-plan-", dir="/tmp")  # unix socket paths must be short
    (tmp_path / "kmsg").touch()
    agent_cfg = AgentConfig(
        node=NODE,
        kmsg_path=str(tmp_path / "kmsg"),
        state_dir=str(tmp_path / "agent"),
        socket_path=f"{run_dir}/a.sock",
    )
    settings: dict[str, Any] = {
        "ledger_path": str(tmp_path / "ledger.sqlite"),
        "save_deadline_s": 5.0,
        "stop_deadline_s": 5.0,
        "gpu_reset_deadline_s": 5.0,
        "gpu_reset_retry_s": 5.0,
        "gpu_reset_backoff_s": 0.05,
        "disabled_rules": [default_rule_name(m) for m in DEFAULT_RULES],
        "api": ApiConfig(enabled=False),
        **coordinator,
    }
    config = Config(coordinator=CoordinatorConfig(**settings))
    broker = MemoryBroker()
    ledger = Ledger(settings["ledger_path"])
    coord = build(
        config,
        bus=MemoryBus(broker, client_id="coordinator"),
        scheduler=scheduler,
        ledger=ledger,
        extra_plugins=(ResetAfterXid48(),),
    )
    agent = build_agent(agent_cfg, bus=MemoryBus(broker, client_id="agent"), node=NODE, gpu_runner=gpu)
    tasks = [asyncio.create_task(coord.run()), asyncio.create_task(agent.run())]
    try:
        yield Cluster(coord, ledger, agent, scheduler, gpu, timeline, agent_cfg.socket_path)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await coord.engine.close()


def records(ledger: Ledger) -> dict[str, ActionRecord]:
    return {r.request.kind: r for r in ledger.actions()}


async def xid48(env: Cluster, release_after_s: float) -> threading.Thread:
    thread = trainer(env.socket_path, env.gpu, env.timeline, release_after_s)
    await until(lambda: JOB in env.coordinator.state.jobs, 10)
    await until(lambda: (env.coordinator.state.jobs[JOB].last_step or 0) >= 3, 10)
    await env.coordinator.engine.handle_event(make_event(NODE, Kind.XID, data={"code": 48, "pci": PCI}))
    return thread


async def test_gpu_reset_runs_after_the_save_and_stop_and_the_requeue_after_the_reset(tmp_path: Path) -> None:
    async with cluster(tmp_path) as env:
        thread = await xid48(env, release_after_s=0.3)
        await until(lambda: env.coordinator.engine.counters["plans"] == 1, 5)
        assert await env.coordinator.engine.wait_idle(30)
        thread.join(5)

        names = env.timeline.names()
        # The trainer acked its save and stopped before anything touched the GPU; its process still
        # held the GPU for a moment after leaving the agent (refused, retried), then the reset ran
        # once, then the job was requeued.
        assert names.index("ack") < names.index("stopped") < names.index("reset") < names.index("requeue")
        assert names.index("gpu_released") < names.index("reset")
        assert env.gpu.resets == 1
        assert env.gpu.refusals == sum(1 for n in names if n == "reset_refused")

        by_kind = records(env.ledger)
        reset, restart = by_kind["gpu_reset"], by_kind["checkpoint_restart"]
        assert reset.state == ActionState.SUCCEEDED, reset.detail
        assert reset.detail["attempts"][-1]["ok"] is True
        assert len(reset.detail["attempts"]) == env.gpu.refusals + 1
        assert restart.state == ActionState.SUCCEEDED, restart.detail
        assert restart.detail["phases_done"] == ["stop", "requeue", "restart", "resume"]
        assert restart.detail["requeued"]["exclude"] == [NODE]
        assert reset.detail["plan"] == restart.detail["plan"]
        plan = env.ledger.plan(reset.detail["plan"])
        assert plan is not None and plan.state == "finished"
        steps = {s.kind: s for s in plan.steps}
        assert [d.action for d in steps["gpu_reset"].after[0]] == [restart.id]
        assert [d.action for d in steps["checkpoint_restart"].after[1]] == [reset.id]
        job = env.scheduler.jobs[JOB]
        assert job.state == "PENDING" and job.restarts == 1 and job.excluded == (NODE,)


async def test_a_reset_that_stays_refused_is_escalated_to_a_reboot_and_the_job_still_moves(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, gpu_reset_retry_s=0.3, gpu_reboot_deadline_s=0.2) as env:
        thread = await xid48(env, release_after_s=3.0)  # a process keeps the GPU past the retries
        assert await env.coordinator.engine.wait_idle(30)
        reset = records(env.ledger)["gpu_reset"]
        assert reset.state == ActionState.ESCALATED, reset.detail
        assert reset.detail["escalation"] == "reboot" and reset.detail["refused"] is True
        assert reset.detail["reboot_unconfirmed"] is True  # the node's agent never restarted here
        assert env.gpu.resets == 0 and len(reset.detail["attempts"]) >= 2
        reboots = [args for op, args in env.scheduler.calls if op == "reboot"]
        assert len(reboots) == 1 and reboots[0][0] == NODE and reboots[0][2] == "RESUME"
        assert str(reboots[0][1]).startswith("ftd: gpu reset of 0000:3b:00.0 not done")
        assert env.scheduler.nodes[NODE].drained and env.scheduler.nodes[NODE].reboot == "RESUME"
        restart = records(env.ledger)["checkpoint_restart"]
        assert restart.state == ActionState.SUCCEEDED and env.scheduler.jobs[JOB].restarts == 1
        thread.join(5)


async def test_a_reboot_the_scheduler_refuses_becomes_a_drain_for_rma(tmp_path: Path) -> None:
    async with cluster(tmp_path, fail_reset=True) as env:
        from ftd.coordinator.actions.scheduler import SchedulerError

        original = env.scheduler.reboot

        async def refuse(node: str, reason: str, nextstate: str = "RESUME") -> None:
            await original(node, reason, nextstate)
            raise SchedulerError("scontrol failed", stderr="RebootProgram isn't defined")

        env.scheduler.reboot = refuse  # type: ignore[method-assign]
        thread = await xid48(env, release_after_s=0.0)
        assert await env.coordinator.engine.wait_idle(30)
        reset = records(env.ledger)["gpu_reset"]
        assert reset.state == ActionState.ESCALATED, reset.detail
        assert reset.detail["escalation"] == "drain" and "RebootProgram" in reset.detail["reboot_error"]
        assert env.gpu.resets == 1  # tried once: a failed reset is not retried, it is escalated
        node = env.scheduler.nodes[NODE]
        assert node.drained and node.reason is not None and "RMA" in node.reason
        assert env.coordinator.state.nodes[NODE].drained_by_ftd
        thread.join(5)


async def test_a_restarted_coordinator_resumes_the_plan_where_it_stopped(tmp_path: Path) -> None:
    """The coordinator dies after the job's stop phase was recorded, while the reset is still refused
    (the GPU held): the next one skips the save and stop, runs the reset, then the requeue."""
    ledger_path = tmp_path / "ledger.sqlite"
    async with cluster(tmp_path, gpu_reset_retry_s=30.0) as env:
        thread = await xid48(env, release_after_s=3.0)

        def stopped() -> bool:
            restart = records(env.ledger).get("checkpoint_restart")
            return restart is not None and "stop" in restart.detail.get("phases_done", [])

        await until(stopped, 10)
        await until(lambda: env.gpu.refusals >= 1, 10)
        await env.coordinator.engine.close()  # the coordinator dies mid-plan
        thread.join(5)
    saves = [n for n in env.timeline.names() if n == "ack"]
    assert len(saves) == 1

    timeline = env.timeline
    gpu = HeldGpu(timeline)
    scheduler = env.scheduler
    broker = MemoryBroker()
    config = Config(
        coordinator=CoordinatorConfig(
            ledger_path=str(ledger_path),
            api=ApiConfig(enabled=False),
            gpu_reset_deadline_s=5.0,
            disabled_rules=[default_rule_name(m) for m in DEFAULT_RULES],
        )
    )
    ledger = Ledger(ledger_path)
    coord = build(
        config,
        bus=MemoryBus(broker, client_id="coordinator"),
        scheduler=scheduler,
        ledger=ledger,
    )
    (tmp_path / "kmsg2").touch()
    agent_cfg = AgentConfig(
        node=NODE,
        kmsg_path=str(tmp_path / "kmsg2"),
        state_dir=str(tmp_path / "agent2"),
        socket_path=f"{tempfile.mkdtemp(prefix='ftd-plan-', dir='/tmp')}/a.sock",
    )
    agent = build_agent(agent_cfg, bus=MemoryBus(broker, client_id="agent"), node=NODE, gpu_runner=gpu)
    tasks = [asyncio.create_task(agent.run()), asyncio.create_task(coord.run())]
    try:
        await until(lambda: coord.engine.counters["actions_started"] >= 2, 10)
        assert await coord.engine.wait_idle(30)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await coord.engine.close()
    by_kind = records(ledger)
    assert by_kind["gpu_reset"].state == ActionState.SUCCEEDED, by_kind["gpu_reset"].detail
    assert by_kind["checkpoint_restart"].state == ActionState.SUCCEEDED
    assert by_kind["checkpoint_restart"].detail["resumed"] == 1
    names = timeline.names()
    assert names.count("ack") == 1 and names.count("reset") == 1 and gpu.resets == 1
    assert names.index("reset") < names.index("requeue")
    assert scheduler.jobs[JOB].restarts == 1
    plan = ledger.plan(by_kind["gpu_reset"].detail["plan"])
    assert plan is not None and plan.state == "finished"
