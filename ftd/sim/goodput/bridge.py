"""The ftd policy's decisions: the real coordinator engine, in a
:class:`~ftd.coordinator.decide.replay.Sandbox`.

What: :class:`EngineBridge` keeps the sandbox's cluster view in step with the simulated job (every
node known and online, the job's one rank per node placed on the nodes it runs on, a node that comes
back from repair undrained), turns each signal of a fault into the :class:`~ftd.events.Event` the
node's agent would publish (an Xid carries its catalog bucket, GPU identity and PCI address as the
kmsg watcher's do), hands it to the engine at its simulated time, and returns what the engine did:
each action it asked for and its gate verdict.

Why: the simulator must not guess what ftd would do; the operator's own rules and policy (cooldowns,
drain budgets, dry-run, disabled rules) decide, so a rule or policy change shows up in goodput. Only
the events a fault produces are fed (a few per fault), never the periodic checkpoints, so a 54-day
run is ~1,000 engine decisions.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ftd.catalog import load_xid_catalog
from ftd.events import Event, JobPresence, Kind, NodeStatus, RankInfo, Severity
from ftd.plugin.actions import ActionState

if TYPE_CHECKING:
    from ftd.config import CoordinatorConfig
    from ftd.sim.goodput.faults import Signal

JOB = "train"
#: How long a hang's diagnosis (diagnose_hang: every node's evidence, then the verdict) takes before the
#: rules act on its verdict; tests/e2e/test_hang_culprit.py measures it on real parts.
DIAGNOSE_S = 5.0
BASE_TS = 1_700_000_000.0  # the simulated run's t = 0 as an epoch (events carry real-looking times)


@dataclass
class Decision:
    """What the engine did with one event: the actions it asked for, and which the gate let run."""

    restart: bool = False  # an allowed checkpoint_restart of the job
    exclude: bool = False  # ... that excludes the node
    drain: bool = False  # an allowed drain_node of the node
    reset: bool = False  # an allowed gpu_reset of the node
    verdicts: list[tuple[str, str]] = field(default_factory=list)  # (kind, verdict) of every action
    delay_s: float = 0.0  # time spent diagnosing before the restart was decided (a hang's verdict)


def node_name(node: int) -> str:
    return f"node{node:05d}"


class EngineBridge:
    def __init__(
        self, cfg: CoordinatorConfig, *, nodes: int, entry_points: bool = False, action_s: float = 60.0
    ) -> None:
        from ftd.coordinator.decide.replay import Sandbox
        from ftd.coordinator.ledger.sqlite import memory_store

        self.sandbox = Sandbox(
            cfg, ledger=memory_store, action_s=action_s, entry_points=entry_points, start=BASE_TS
        )
        self.state = self.sandbox.state
        self.engine = self.sandbox.engine
        self._ids = itertools.count()
        self._catalog = load_xid_catalog()
        for node in range(nodes):
            self.state.apply_status(NodeStatus(node=node_name(node), state="online", ts=BASE_TS))

    # --- the cluster view -------------------------------------------------------------------

    def place(self, node: int, slot: int) -> None:
        presence = JobPresence(job=JOB, node=node_name(node), ranks=[RankInfo(rank=slot)])
        self.state.apply_presence(node_name(node), JOB, presence)

    def unplace(self, node: int) -> None:
        self.state.apply_presence(node_name(node), JOB, None)

    def node_back(self, node: int) -> None:
        """Repaired and through preflight: online and no longer drained by ftd."""
        name = node_name(node)
        self.state.mark_drained(name, "", drained=False)
        self.state.nodes[name].online = True

    # --- events -------------------------------------------------------------------------------

    def event(self, signal: Signal, node: int, t: float, gpu: int, slot: int) -> Event:
        name = node_name(node)
        data: dict[str, Any] = dict(signal.data)
        uuid = f"GPU-{node:05d}-{gpu}"
        pci = f"0000:{0x18 + 0x10 * gpu:02x}:00.0"
        if signal.kind in ("xid", "gpu_fallen_off_bus", "row_remap", "ecc", "thermal", "pcie_aer"):
            data.update(uuid=uuid, pci=pci, gpu=gpu)
        if signal.kind == "xid":
            info = self._catalog.get(int(data["code"]))
            data.setdefault("action", info.action)
        if signal.kind in ("rank_heartbeat_lost", "log_pattern"):
            data.update(job=JOB, rank=slot)
        if signal.kind == "node_offline":
            data["jobs"] = [JOB] if self.state.jobs_on_node(name) else []
        return Event(
            id=f"sim-{next(self._ids)}",
            ts=BASE_TS + t,
            node=name,
            kind=Kind(signal.kind),
            severity=Severity(signal.severity),
            source="sim",
            data=data,
        )

    async def feed(self, event: Event) -> Decision:
        await self.sandbox.clock.advance(event.ts)
        node = self.state._node(event.node)
        if event.kind == Kind.NODE_OFFLINE:
            node.online = False
        records = await self.engine.handle_event(event)
        decision = Decision()
        for record in records:
            request = record.request
            allowed = record.state in (ActionState.PENDING, ActionState.RUNNING)
            verdict = "allowed" if allowed else str(record.state)
            decision.verdicts.append((str(request.kind), verdict))
            if not allowed:
                continue
            if request.kind == "checkpoint_restart" and request.target == JOB:
                decision.restart = True
                exclude = request.params.get("exclude") or []
                decision.exclude = decision.exclude or event.node in exclude
            elif request.kind == "drain_node" and request.target == event.node:
                decision.drain = True
            elif request.kind == "gpu_reset" and request.target == event.node:
                decision.reset = True
        await self.sandbox.settle()
        if ("diagnose_hang", "allowed") in decision.verdicts:
            decision = await self._diagnosed(event, decision)
        return decision

    async def _diagnosed(self, event: Event, decision: Decision) -> Decision:
        """The verdict of a hang's diagnosis, fed as the coordinator would: the simulated fault is on the
        node whose rank went silent (one rank per node), and the evidence names it."""
        verdict = Event(
            id=f"sim-{next(self._ids)}",
            ts=event.ts + DIAGNOSE_S,
            node=event.node,
            kind=Kind.HANG_VERDICT,
            severity=Severity.ERROR,
            source="coordinator",
            data={
                "job": JOB,
                "verdict": "culprit",
                "confident": True,
                "why": "simulated: the silent rank's node",
                "culprit_nodes": [event.node],
                "unclear": "restart",
            },
        )
        after = await self.feed(verdict)
        return Decision(
            restart=decision.restart or after.restart,
            exclude=decision.exclude or after.exclude,
            drain=decision.drain or after.drain,
            reset=decision.reset or after.reset,
            verdicts=decision.verdicts + after.verdicts,
            delay_s=DIAGNOSE_S + after.delay_s
            if after.restart and not decision.restart
            else decision.delay_s,
        )

    async def close(self) -> None:
        """Stop what still runs: the run is over, how its last actions end does not count."""
        await self.engine.close()
