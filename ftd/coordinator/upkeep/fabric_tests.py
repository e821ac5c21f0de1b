"""Bisections the coordinator runs: pin a slow node with few pair tests, on idle or drained nodes only.

What: :meth:`FabricTests.bisect` drives a :class:`~ftd.fabric.bisect.Bisection` with live agents: each
wave's disjoint pairs become ``pair_test`` actions (:class:`~ftd.coordinator.actions.pair_test.PairTest`,
``params.peer`` the pair's other node) submitted through the engine (so the policy gate, the ledger
and the dry run apply as to any action); each finished action's result is judged against the fleet's
hardware profile and baseline (:func:`~ftd.fabric.pairs.judge_pair`) and recorded, until the
bisection is done or its budget spent. The nodes are those that are online and run no job (idle or
drained): a test never runs on a node that is training (the agents refuse too). The finding is kept
(:attr:`FabricTests.last`) for the API (``GET /v1/fabric/bisect``), which also starts one
(``POST /v1/fabric/bisect`` with the suspects: passive evidence or a slow pair). With ``auto``, a
``pair_test`` event judged slow (not one of a bisection's own tests) starts one by itself, its slow
side the suspects, and so does passive evidence on a node's link (:func:`passive_suspect`: a port's
error counter over its rule, a port below its profile's rate, a NIC's PCIe link degraded), that node
the suspect; at most one per ``cooldown_s``. :meth:`FabricTests.run_mesh` is the pingmesh: one
probe every ``coordinator.fabric.mesh_interval_s`` to the next pair of idle nodes, round-robin (a
``pair_test`` directive for 0 bytes, not an action: the agent's event carries the RTT into the matrix).

Why an upkeep: like the return to service, it sequences ordinary actions and waits on their records
(an :meth:`~ftd.coordinator.decide.engine.Engine.observe` observer); the planning is pure code in
:mod:`ftd.fabric.bisect`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ftd.config.schema import HardwareConfig
from ftd.coordinator.actions.directive import NodeSend
from ftd.coordinator.actions.pair_test import PAIR_TEST, peer_address
from ftd.coordinator.model.pairs import fleet_expectation
from ftd.coordinator.model.state import ClusterState
from ftd.events import Directive, Event, Kind
from ftd.fabric.bisect import Bisection
from ftd.fabric.pairs import (
    PairResult,
    fleet_allreduce_baseline,
    fleet_baseline,
    fleet_rtt_baseline,
    judge_pair,
)
from ftd.logs import get_logger
from ftd.plugin.actions import ActionRecord, ActionRequest

__all__ = ["RULE", "FabricTests"]

log = get_logger(__name__)

RULE = "fabric_tests"


def passive_suspect(event: Event) -> bool:
    """Passive evidence that points at a node's link (issue #35 item 4): a fabric counter of a port
    or NIC crossing its warning or fatal rule (congestion is the fabric's, not a node's), a port
    running below its profile's rate or width, or a NIC's PCIe link degraded."""
    data = event.data
    if event.kind == Kind.FABRIC:
        if data.get("check") == "counter":
            return (
                data.get("status") == "crossed"
                and data.get("class") in ("fatal", "warning")
                and (data.get("source") in ("ib", "hw", "phy"))
            )
        return data.get("check") == "port_rate" and data.get("status") == "degraded"
    if event.kind == Kind.PCIE_LINK:
        return data.get("status") == "degraded" and str(data.get("device", "")).startswith("nic")
    return False


class FabricTests:
    def __init__(
        self,
        submit: Callable[[ActionRequest], Awaitable[ActionRecord]],
        state: ClusterState,
        *,
        hardware: HardwareConfig,
        deadline_s: float = 60.0,
        auto: bool = False,
        cooldown_s: float = 600.0,
    ) -> None:
        self._submit = submit
        self._state = state
        self._hardware = hardware
        self.deadline_s = deadline_s
        self._waiting: dict[str, asyncio.Future[ActionRecord]] = {}
        self.last: dict[str, Any] | None = None
        self.running = False
        self.auto = auto  # a slow pair_test event starts a bisection (coordinator.fabric.auto_bisect)
        self.cooldown_s = cooldown_s
        self._last_auto = -float("inf")
        self._mine: set[str] = set()  # the pair_test actions our bisections submitted
        self._tasks: set[asyncio.Task[Any]] = set()
        self._mesh_turn = 0
        self.last_probe: str | None = None  # the directive id of the newest pingmesh probe

    def observe(self, what: str, payload: Any) -> None:
        if what == "event":
            if self.auto and isinstance(payload, Event) and payload.kind == Kind.PAIR_TEST:
                self._slow_pair(payload)
            elif self.auto and isinstance(payload, Event) and passive_suspect(payload):
                self._start(
                    (payload.node,), f"{payload.kind} {payload.data.get('subject', '')}".strip(), payload.id
                )
            return
        if what != "action" or not isinstance(payload, ActionRecord) or not payload.state.finished:
            return
        future = self._waiting.pop(payload.id, None)
        if future is not None and not future.done():
            future.set_result(payload)

    def _slow_pair(self, event: Event) -> None:
        """A pair test came back slow (and not from a bisection of ours): bisect with its slow side as
        the suspects, unless one runs or the last one started within ``cooldown_s``."""
        if self.running or event.data.get("action_id") in self._mine:
            return
        if time.monotonic() - self._last_auto < self.cooldown_s:
            return
        expect, profile, _ = fleet_expectation(self._hardware)
        result = PairResult.from_dict(event.data)
        verdict = self._state.pairs.judge_result(result, expect, profile)
        if verdict.status != "slow" or result.probe:
            return
        # slow as a pair with every direction fine (its all-reduce, its round trip): both ends suspect
        suspects = verdict.slow_senders or tuple(n for n in (result.a, result.b) if n)
        self._start(suspects, "a slow pair test", event.id)

    def _start(self, suspects: tuple[str, ...], why: str, event_id: str) -> None:
        """Start a bisection with ``suspects`` first, unless one runs or the last automatic one
        started within ``cooldown_s`` (the slow pair's check is made by the caller too)."""
        if self.running or time.monotonic() - self._last_auto < self.cooldown_s:
            return
        self._last_auto = time.monotonic()
        self.running = True  # at once: the next slow event does not start a second one
        log.info("bisection_started", suspects=list(suspects), why=why, because=event_id)
        task = asyncio.get_running_loop().create_task(self.bisect(suspects), name="bisection")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def next_probe(self) -> tuple[str, str] | None:
        """The next pair of the pingmesh: every unordered pair of idle nodes in turn, round-robin."""
        idle = [n for n in self.idle_nodes() if peer_address(self._state, n) is not None]
        count = len(idle) * (len(idle) - 1) // 2
        if count == 0:
            return None
        k = self._mesh_turn % count
        self._mesh_turn += 1
        for i in range(len(idle) - 1):  # the k-th pair (i, j), i < j, in row order
            row = len(idle) - 1 - i
            if k < row:
                return idle[i], idle[i + 1 + k]
            k -= row
        return None  # unreachable: k < count

    async def probe(self, send: NodeSend, port: int) -> tuple[str, str] | None:
        """Send the next pingmesh probe (a ``pair_test`` directive for 0 bytes, no action: the agent's
        ``pair_test`` event carries the RTT into the matrix); the pair probed, or ``None``."""
        pair = self.next_probe()
        if pair is None:
            return None
        a, b = pair
        host = peer_address(self._state, b)
        directive = Directive(
            id=f"mesh-{uuid.uuid4().hex[:12]}",
            ts=time.time(),
            action="pair_test",
            node=a,
            reason="pingmesh probe",
            deadline_s=10.0,
            params={"peer": b, "host": host, "port": port, "max_bytes": 0, "timeout_s": 2.0},
        )
        self.last_probe = directive.id
        await send(a, directive)
        return pair

    async def run_mesh(
        self, send: NodeSend, *, port: int, interval_s: float, forget: Callable[[str], None] = lambda _: None
    ) -> None:
        """One probe every ``interval_s`` until cancelled (a send that fails is logged, not fatal).
        ``forget`` drops the previous probe's answer (nobody waits for it: the event is what counts)."""
        while True:
            await asyncio.sleep(interval_s)
            if self.last_probe is not None:
                forget(self.last_probe)
            try:
                await self.probe(send, port)
            except Exception as exc:  # the bus down: the next tick tries again
                log.info("pingmesh_probe_not_sent", error=str(exc))

    async def settle(self) -> None:
        """Wait for the bisections started by slow pair tests (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def idle_nodes(self) -> list[str]:
        """Nodes a test may run on: online and running no job (idle, or drained)."""
        return sorted(
            n.name for n in self._state.nodes.values() if n.online and not self._state.jobs_on_node(n.name)
        )

    async def _test(self, a: str, b: str) -> ActionRecord:
        request = ActionRequest(
            kind=PAIR_TEST,
            target=a,
            reason=f"bisection: pair test {a} <-> {b}",
            params={"peer": b},
            rule=RULE,
        )
        record = await self._submit(request)
        self._mine.add(record.id)
        if len(self._mine) > 4096:
            self._mine.pop()
        if record.state.finished:
            return record
        future = self._waiting.setdefault(record.id, asyncio.get_running_loop().create_future())
        try:
            async with asyncio.timeout(self.deadline_s + 30.0):
                return await future
        except TimeoutError:
            self._waiting.pop(record.id, None)
            return record

    async def bisect(
        self, suspects: Sequence[str] = (), nodes: Sequence[str] | None = None, budget: int | None = None
    ) -> dict[str, Any]:
        """Run a bisection over ``nodes`` (default: the idle ones) with ``suspects`` first."""
        started = time.time()
        idle = set(self.idle_nodes())
        chosen = [n for n in (nodes if nodes is not None else sorted(idle)) if n in idle]
        skipped = sorted(set(nodes or ()) - idle)
        bisection = Bisection(chosen, suspects=suspects, budget=budget)
        expect, profile, note = fleet_expectation(self._hardware)
        tests: list[dict[str, Any]] = []
        seen: list[PairResult] = []
        self.running = True
        try:
            while wave := bisection.next_wave():
                records = await asyncio.gather(*(self._test(a, b) for a, b in wave))
                results = [_result(a, b, record) for (a, b), record in zip(wave, records, strict=True)]
                seen.extend(r for r in results if not r.error)
                # the fleet's recent results and this bisection's (its events may not be folded yet)
                history = [*self._state.pairs.recent, *seen]
                baseline, collective = fleet_baseline(history), fleet_allreduce_baseline(history)
                rtt = fleet_rtt_baseline([*self._state.pairs.round_trips, *seen])
                for (a, b), record, result in zip(wave, records, results, strict=True):
                    verdict = judge_pair(
                        result,
                        expect,
                        baseline,
                        profile=profile,
                        allreduce_baseline_gbps=collective,
                        rtt_baseline_ms=rtt,
                    )
                    failed = verdict.status in ("failed", "skipped")
                    together = verdict.status == "slow" and not verdict.slow_senders
                    bisection.record(a, b, verdict.slow_senders, failed=failed, pair_slow=together)
                    tests.append({"a": a, "b": b, "action_id": record.id, **verdict.as_dict()})
        finally:
            self.running = False
        finding = bisection.finding()
        self.last = {
            "started": started,
            "seconds": round(time.time() - started, 3),
            "nodes": chosen,
            "not_idle": skipped,
            "suspects": list(suspects),
            "note": note,
            "pair_tests": tests,  # each test's verdict ("tests" is the finding's count)
            **finding.as_dict(),
        }
        log.info(
            "bisection_done",
            bad_nodes=list(finding.bad_nodes),
            tests=finding.tests,
            confirmed=finding.confirmed,
        )
        return self.last


def _result(a: str, b: str, record: ActionRecord) -> PairResult:
    """The pair test a finished ``pair_test`` action carries, or its failure as the result's error."""
    raw = record.detail.get("result")
    if isinstance(raw, dict):
        return PairResult.from_dict(raw)
    return PairResult(a=a, b=b, error=str(record.detail.get("pair_test") or f"action {record.state}"))
