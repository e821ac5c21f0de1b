"""A whole ftd cluster in one process: broker, coordinator, N real agents and trainer ranks.

Everything is the production code — the agents read their kernel log from a file (the simulated
``/dev/kmsg``), trainers are real :class:`ftd.client.Client` instances on threads talking to their
agent's unix socket, the bus is MQTT on an embedded broker (or any broker given) — except the
scheduler, which is the in-process :class:`FakeScheduler` (Slurm is not needed to watch ftd work).

Used by ``ftd demo`` and by tests that want the full loop without subprocesses.

A large cluster (``agents`` fewer than ``nodes``): the first ``agents`` nodes run real agents, the
others are seeded into the coordinator's state (:mod:`ftd.sim.seed`) with no process, socket or bus
connection each, in racks of 32. :meth:`SimCluster.start` waits on the real readiness -- the
coordinator's ready callback, each agent online at the coordinator -- for ``start_timeout_s``
(generous: a loaded machine is slow, not broken) and fails at once, naming it, when the coordinator
or an agent stops while starting; a timeout names what did not come up (:class:`SimStartError`).
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftd.agent.app import Agent, status_messages
from ftd.agent.wiring import build_agent
from ftd.bus.base import Bus
from ftd.bus.embedded import EmbeddedBroker
from ftd.bus.mqtt import MqttBus
from ftd.client import Client
from ftd.config import (
    AgentConfig,
    ApiConfig,
    Config,
    CoordinatorConfig,
    NvmlConfig,
    PairTestsConfig,
    PolicyConfig,
)
from ftd.coordinator.actions.scheduler import FakeScheduler
from ftd.coordinator.daemon import Coordinator
from ftd.coordinator.ledger.sqlite import Ledger
from ftd.coordinator.wiring import build, coordinator_will
from ftd.sim.seed import rack_labels, seed_online

Timeline = Callable[[str, str], None]  # (who, what)
START_TIMEOUT_S = 120.0  # how long start() waits for the coordinator and the agents to come up


class SimStartError(RuntimeError):
    """The simulated cluster did not come up: the message names what (the coordinator, which agents)."""


class StepSync:
    """What ``all_reduce(MAX)`` of the save/stop flags does for a real DDP job: every rank of the job
    agrees, at each step, on whether to save or stop — so they all save at the same step."""

    def __init__(self, ranks: int) -> None:
        self._flags: dict[int, tuple[bool, bool]] = {}
        self._agreed = (False, False)
        self._barrier = threading.Barrier(ranks, action=self._reduce)

    def _reduce(self) -> None:
        values = list(self._flags.values())
        self._agreed = (any(v[0] for v in values), any(v[1] for v in values))

    def agree(self, rank: int, save: bool, stop: bool) -> tuple[bool, bool]:
        self._flags[rank] = (save, stop)
        try:
            self._barrier.wait(timeout=5)
        except threading.BrokenBarrierError:  # a peer is gone: act on what this rank knows
            return save, stop
        return self._agreed

    def abort(self) -> None:
        self._barrier.abort()


@dataclass
class SimRank:
    """One simulated training rank: a thread running a tiny training loop with the real client."""

    job: str
    rank: int
    node: str
    socket_path: str
    checkpoint_dir: Path
    timeline: Timeline
    sync: StepSync
    start_step: int = 0
    step_s: float = 0.01
    saved: list[tuple[int, str]] = field(default_factory=list)
    step: int = 0
    stopped: bool = False
    save_seen_ns: int | None = None
    _last_save_t: float = 0.0
    _thread: threading.Thread | None = None
    _quit: threading.Event = field(default_factory=threading.Event)

    def start(self) -> SimRank:
        self._thread = threading.Thread(target=self._loop, name=f"rank-{self.job}-{self.rank}", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        with Client(job=self.job, rank=self.rank, socket_path=self.socket_path) as client:
            self.step = self.start_step
            while not self._quit.is_set():
                self.step += 1
                time.sleep(self.step_s)  # "train"
                client.heartbeat(self.step)
                wants_save = client.should_save()
                if wants_save and self.saved and time.monotonic() - self._last_save_t < 2.0:
                    # A peer's flag made us save a moment ago, before our own directive arrived:
                    # that checkpoint is the answer to it.
                    client.ack_saved(*self.saved[-1])
                    wants_save = False
                save, stop = self.sync.agree(self.rank, wants_save, client.should_stop())
                if save:
                    directive = client.pending_directive
                    if self.save_seen_ns is None and directive is not None:
                        self.save_seen_ns = directive.received_ns
                    path = self.checkpoint_dir / f"job{self.job}-rank{self.rank}-step{self.step}.pt"
                    path.write_text(f"step={self.step}\n")
                    client.ack_saved(self.step, str(path))
                    self.saved.append((self.step, str(path)))
                    self._last_save_t = time.monotonic()
                    self.timeline(
                        f"rank {self.rank}@{self.node}", f"saved checkpoint at step {self.step}, acked"
                    )
                if stop:
                    self.stopped = True
                    self.timeline(
                        f"rank {self.rank}@{self.node}", f"stop received, exiting at step {self.step}"
                    )
                    break

    def join(self, timeout: float = 5.0) -> None:
        self._quit.set()
        self.sync.abort()
        if self._thread is not None:
            self._thread.join(timeout)


class SimCluster:
    def __init__(
        self,
        *,
        nodes: int = 4,
        workdir: Path | None = None,
        broker_port: int | None = None,
        timeline: Timeline | None = None,
        save_deadline_s: float = 10.0,
        api_port: int | None = None,
        agents: int | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="ftd-sim-", dir="/tmp")
        self.workdir = workdir or Path(self._tmp.name if self._tmp else ".")
        self.node_names = [f"node-{i}" for i in range(1, nodes + 1)]
        # the nodes that run a real agent (all by default); the others are seeded (ftd.sim.seed)
        self.agent_nodes = self.node_names[: nodes if agents is None else max(0, min(agents, nodes))]
        self.seeded_nodes = self.node_names[len(self.agent_nodes) :]
        self.start_timeout_s = start_timeout_s
        self.timeline = timeline or (lambda who, what: None)
        self.broker_port = broker_port
        self.scheduler = FakeScheduler()
        for name in self.node_names:
            self.scheduler.add_node(name)
        self.config = Config(
            coordinator=CoordinatorConfig(
                ledger_path=str(self.workdir / "ledger.sqlite"),
                save_deadline_s=save_deadline_s,
                stop_deadline_s=save_deadline_s,
                scheduler="none",
                policy=PolicyConfig(cooldown_s=600.0),
                # a simulation takes no API port unless asked (`ftd demo --serve --port N`): never
                # silently the operator's 8787
                api=ApiConfig(enabled=api_port is not None, port=api_port or ApiConfig().port),
                node_labels=rack_labels(self.node_names) if self.seeded_nodes else [],
            )
        )
        self.broker: EmbeddedBroker | None = None
        self.coordinator: Coordinator | None = None
        self.agents: dict[str, Agent] = {}
        self.ranks: list[SimRank] = []
        self._tasks: list[asyncio.Task[Any]] = []

    def kmsg_path(self, node: str) -> Path:
        return self.workdir / node / "kmsg"

    def socket_path(self, node: str) -> str:
        return str(self.workdir / node / "agent.sock")

    def _bus(self, client_id: str, **kw: Any) -> Bus:
        assert self.broker_port is not None
        return MqttBus(
            host="127.0.0.1", port=self.broker_port, client_id=client_id, reconnect_max_s=1.0, **kw
        )

    async def start(self) -> None:
        if self.broker_port is None:
            self.broker = await EmbeddedBroker().start()
            self.broker_port = self.broker.port
        self.coordinator = build(
            self.config,
            bus=self._bus("ftd-coordinator", will=coordinator_will(), manual_ack=True),
            scheduler=self.scheduler,
            ledger=Ledger(self.config.coordinator.ledger_path),
        )
        ready = asyncio.Event()
        self._tasks.append(asyncio.create_task(self.coordinator.run(ready.set), name="the coordinator"))
        for node in self.agent_nodes:
            (self.workdir / node).mkdir(parents=True, exist_ok=True)
            self.kmsg_path(node).touch()
            cfg = AgentConfig(
                node=node,
                kmsg_path=str(self.kmsg_path(node)),
                state_dir=str(self.workdir / node / "state"),
                socket_path=self.socket_path(node),
                nvml=NvmlConfig(enabled=False),  # simulated nodes have no GPUs to watch
                # nor a fabric to test (and share one host: each would want the same port)
                pair_tests=PairTestsConfig(enabled=False),
            )
            will, birth = status_messages(node)
            agent = build_agent(cfg, bus=self._bus(f"ftd-agent-{node}", will=will, birth=birth), node=node)
            self.agents[node] = agent
            self._tasks.append(asyncio.create_task(agent.run(), name=f"the agent of {node}"))
        deadline = time.monotonic() + self.start_timeout_s
        await self._come_up(ready.is_set, lambda: "the coordinator (ledger, API, bus)", deadline)
        seed_online(self.coordinator_state, self.seeded_nodes)

        def missing() -> list[str]:
            online = set(self.coordinator_state.online_nodes())
            return [n for n in self.agent_nodes if n not in online]

        def agents_missing() -> str:
            gone = missing()
            shown = ", ".join(gone[:10]) + (f" and {len(gone) - 10} more" if len(gone) > 10 else "")
            return f"{len(gone)} of {len(self.agent_nodes)} agents online at the coordinator ({shown})"

        await self._come_up(lambda: not missing(), agents_missing, deadline)

    async def _come_up(self, up: Callable[[], bool], what: Callable[[], str], deadline: float) -> None:
        """Wait until ``up()``; SimStartError naming ``what()`` at ``deadline``, or at once naming the
        task (the coordinator, an agent) that ended while starting, with its error."""
        while not up():
            for task in self._tasks:
                if task.done():
                    error = None if task.cancelled() else task.exception()
                    why = f": {type(error).__name__}: {error}" if error is not None else ""
                    raise SimStartError(f"{task.get_name()} stopped while the cluster was starting{why}")
            if time.monotonic() > deadline:
                raise SimStartError(f"not up after {self.start_timeout_s:g} s: {what()}")
            await asyncio.sleep(0.02)

    @property
    def coordinator_state(self) -> Any:
        assert self.coordinator is not None
        return self.coordinator.state

    async def wait_for(self, condition: Callable[[], bool], timeout: float, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
            await asyncio.sleep(0.01)

    async def launch_job(self, job: str, nodes: list[str], *, start_step: int = 0) -> list[SimRank]:
        """Start one rank per node (as the scheduler would) and wait until the coordinator sees them."""
        if job in self.scheduler.jobs:
            self.scheduler.start_job(job, nodes)
        else:
            self.scheduler.add_job(job, nodes)
        ckpt = self.workdir / "checkpoints"
        ckpt.mkdir(exist_ok=True)
        sync = StepSync(len(nodes))
        ranks = [
            SimRank(
                job, rank, node, self.socket_path(node), ckpt, self.timeline, sync, start_step=start_step
            ).start()
            for rank, node in enumerate(nodes)
        ]
        self.ranks.extend(ranks)
        await self.wait_for(
            lambda: sorted(self.coordinator_state.job_nodes(job)) == sorted(nodes),
            15,
            f"job {job} registered",
        )
        return ranks

    def write_kernel_line(self, node: str, line: str) -> float:
        """Append a kernel-log line to ``node``'s simulated /dev/kmsg; returns perf_counter() at write."""
        with self.kmsg_path(node).open("a") as f:
            f.write(line.rstrip("\n") + "\n")
            f.flush()
            return time.perf_counter()

    async def stop(self) -> None:
        for rank in self.ranks:
            await asyncio.to_thread(rank.join, 2.0)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.coordinator is not None:
            await self.coordinator.close()
        if self.broker is not None:
            await self.broker.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
