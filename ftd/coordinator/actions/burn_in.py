"""The ``burn_in`` executor: ask a drained or new node's agent to run its burn-in (issue #36 item 4).

A ``burn_in`` node directive goes to ``ftd/v1/nodes/{node}/directives``; the agent runs
:mod:`ftd.agent.preflight.burn_in` (refusing while a job runs there), publishes the report as a
``burn_in`` event and answers with an Ack whose ``ok`` is "passed" and ``data["report"]`` the report.
Succeeded when it passed; escalated when it failed, was incomplete (a step skipped) or refused (the
report's reason in ``detail["burn_in"]``, its verdict in ``detail["verdict"]``); failed on no answer by
the deadline. The return to service (:mod:`ftd.coordinator.upkeep.return_service`) runs it after the
preflight when ``coordinator.return_to_service.require_burn_in`` is set.

The fleet's figure: the executor keeps the median matmul TFLOPS of the last burn-ins that passed, per
hardware profile (:class:`FleetFigures`, in memory: refilled as nodes pass after a restart), and
sends them with each directive (``params["fleet_tflops"]``: profile -> TFLOPS); the agent compares its
GPUs with its own profile's figure (a slow GPU fails against the fleet as well as the profile).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from typing import Any

from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.directive import NodeSend, ask_node, directive_for
from ftd.plugin.actions import ActionRecord, ActionState

BURN_IN = "burn_in"
FLEET_KEEP = 32  # burn-ins per profile whose medians make the fleet's figure
FLEET_MIN = 3  # fewer passed burn-ins than this: no fleet figure yet


class FleetFigures:
    """Per profile, the matmul medians of the last :data:`FLEET_KEEP` burn-ins that passed."""

    def __init__(self) -> None:
        self._seen: dict[str, deque[float]] = {}

    def add(self, report: dict[str, Any]) -> None:
        if report.get("verdict") != "passed" or not isinstance(report.get("profile"), str):
            return
        for step in report.get("steps") or []:
            figures = step.get("figures") if isinstance(step, dict) else None
            median = (
                figures.get("median") if isinstance(figures, dict) and step.get("name") == "matmul" else None
            )
            if isinstance(median, int | float) and not isinstance(median, bool) and median > 0:
                self._seen.setdefault(report["profile"], deque(maxlen=FLEET_KEEP)).append(float(median))

    def figures(self) -> dict[str, float]:
        return {p: round(statistics.median(v), 1) for p, v in self._seen.items() if len(v) >= FLEET_MIN}


class BurnIn:
    """See the module docstring."""

    def __init__(
        self,
        *,
        send: NodeSend,
        acks: AckBook,
        deadline_s: float,
        pair_peer: Callable[[str], dict[str, Any] | None] | None = None,
        pair_baseline: Callable[[], float | None] = lambda: None,
        pair_rtt_baseline: Callable[[], float | None] = lambda: None,
    ) -> None:
        self._send = send
        self._acks = acks
        self.deadline_s = deadline_s
        self.fleet = FleetFigures()
        # the pair step's known-good peer for a node (node, host, port) and the fleet's baselines
        # (issue #35's pair tests): None where pair tests are off or no idle peer has an address
        self.pair_peer = pair_peer
        self.pair_baseline = pair_baseline
        self.pair_rtt_baseline = pair_rtt_baseline  # the fleet's median round trip (ms)

    async def __call__(self, record: ActionRecord) -> dict[str, Any]:
        node = record.request.target
        params: dict[str, Any] = {"fleet_tflops": self.fleet.figures()}
        peer = self.pair_peer(node) if self.pair_peer is not None else None
        if peer is not None:
            params["pair_peer"] = peer
            params["pair_baseline_gbps"] = self.pair_baseline()
            params["pair_rtt_baseline_ms"] = self.pair_rtt_baseline()
        directive = directive_for(record, "burn_in", node=node, deadline_s=self.deadline_s, params=params)
        ack = await ask_node(self._send, self._acks, directive, self.deadline_s)
        if ack is None:
            return {
                "state": str(ActionState.FAILED),
                "burn_in": f"no answer from {node}'s agent within {self.deadline_s:g} s",
            }
        raw = ack.data.get("report")
        report: dict[str, Any] = raw if isinstance(raw, dict) else {}
        verdict = str(report.get("verdict", "passed" if ack.ok else "failed"))
        self.fleet.add(report)
        detail: dict[str, Any] = {
            "passed": ack.ok,
            "burn_in": ack.reason,
            "verdict": verdict,
            "report": report,
        }
        if not ack.ok:
            detail["state"] = str(ActionState.ESCALATED)
        return detail


__all__ = ["BURN_IN", "BurnIn", "FleetFigures"]
