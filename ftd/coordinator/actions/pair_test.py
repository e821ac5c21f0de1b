"""The ``pair_test`` executor: ask a node's agent to test the pair it forms with an idle peer.

Used by the return to service (:mod:`ftd.coordinator.upkeep.return_service`, after the preflight,
when ``coordinator.fabric.return_gate`` is on) and by anything that wants one pair measured. The
peer is ``params["peer"]`` or, when none is named, :func:`choose_peer`: an online node of the fleet
that runs no job, is not drained, announced an address, and (preferably) passed its newest pair
test. A ``pair_test`` node directive goes to the node (``params``: the peer, its address and the
agents' port); the agent runs :func:`ftd.agent.pair_tests.client.run_pair_test` and answers with
the result in its Ack, which is judged here (:func:`ftd.fabric.pairs.judge_pair`: the fleet's
hardware profile and the baseline of :class:`~ftd.coordinator.model.pairs.PairBook`). Succeeded when
it passes, escalated when it is slow or failed (the reasons in ``detail["pair_test"]``), failed with
no idle peer or no answer by the deadline: a gate fails closed.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from ftd.config.schema import HardwareConfig
from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.directive import NodeSend, ask_node, directive_for
from ftd.coordinator.model.pairs import fleet_expectation
from ftd.coordinator.model.state import ClusterState
from ftd.fabric.pairs import PairResult
from ftd.plugin.actions import ActionRecord, ActionState

__all__ = [
    "PAIR_TEST",
    "PairTest",
    "burn_in_peer",
    "choose_peer",
    "peer_address",
]

PAIR_TEST = "pair_test"


def peer_address(state: ClusterState, node: str) -> str | None:
    """The first IP address ``node``'s agent announced (host names are skipped: no DNS here)."""
    record = state.nodes.get(node)
    for address in record.addresses if record is not None else ():
        try:
            ipaddress.ip_address(address)
        except ValueError:
            continue
        return address
    return None


def choose_peer(state: ClusterState, node: str, exclude: frozenset[str] = frozenset()) -> str | None:
    """An idle, online, undrained node with an address to test ``node`` against; one whose newest
    pair test passed first (a known-good partner), then by name."""
    candidates = [
        n.name
        for n in state.nodes.values()
        if n.name != node
        and n.name not in exclude
        and n.online
        and not n.drained_by_ftd
        and n.name not in state.unavailable
        and not state.jobs_on_node(n.name)
        and peer_address(state, n.name) is not None
    ]
    tested_ok = {a for (a, _), t in state.pairs.pairs.items() if not t.result.error} | {
        b for (_, b), t in state.pairs.pairs.items() if not t.result.error
    }
    candidates.sort(key=lambda n: (n not in tested_ok, n))
    return candidates[0] if candidates else None


def burn_in_peer(state: ClusterState, port: int, node: str) -> dict[str, Any] | None:
    """The known-good idle peer a burn-in's pair step tests ``node`` against (:func:`choose_peer`),
    with where its pair-test server listens; None when there is none."""
    peer = choose_peer(state, node)
    host = peer_address(state, peer) if peer is not None else None
    if peer is None or host is None:
        return None
    return {"node": peer, "host": host, "port": port}


class PairTest:
    def __init__(
        self,
        *,
        send: NodeSend,
        acks: AckBook,
        state: ClusterState,
        hardware: HardwareConfig,
        port: int,
        deadline_s: float,
    ) -> None:
        self._send = send
        self._acks = acks
        self._state = state
        self._hardware = hardware
        self.port = port
        self.deadline_s = deadline_s

    async def __call__(self, record: ActionRecord) -> dict[str, Any]:
        node = record.request.target
        named = record.request.params.get("peer")
        peer = named if isinstance(named, str) and named else choose_peer(self._state, node)
        if peer is None:
            return {"state": str(ActionState.FAILED), "pair_test": f"no idle peer to test {node} against"}
        outcome = await self.measure(record, node, peer)
        detail = {"peer": peer, "pair_test": outcome["why"]}
        if "result" in outcome:
            detail["result"] = outcome["result"]
        if outcome["status"] == "pass":
            return {"passed": True, **detail}
        if outcome.get("answered") is False:
            return {"state": str(ActionState.FAILED), **detail}
        return {"state": str(ActionState.ESCALATED), "passed": False, "verdict": outcome["status"], **detail}

    async def measure(
        self, record: ActionRecord, node: str, peer: str, *, suffix: str | None = None, allreduce: bool = True
    ) -> dict[str, Any]:
        """Have ``node``'s agent test the pair it forms with ``peer`` and judge it: ``status`` (a
        :class:`~ftd.fabric.pairs.PairVerdict`'s: pass, slow, failed, skipped), ``why``, the
        ``result`` when one came back, ``answered`` False when none did (failed, fails closed).
        ``allreduce`` False: the agent skips the all-reduce step (seconds of torch start-up)."""
        host = peer_address(self._state, peer)
        if host is None:
            return {"status": "failed", "answered": False, "why": f"{peer} announced no address"}
        params: dict[str, Any] = {"peer": peer, "host": host, "port": self.port}
        if not allreduce:
            params["allreduce_bytes"] = 0  # the TCP phases only (a restart waits for this test)
        directive = directive_for(
            record, "pair_test", suffix=suffix, node=node, deadline_s=self.deadline_s, params=params
        )
        ack = await ask_node(self._send, self._acks, directive, self.deadline_s)
        if ack is None:
            why = f"no answer from {node}'s agent within {self.deadline_s:g} s"
            return {"status": "failed", "answered": False, "why": why}
        raw = ack.data.get("pair_test")
        result = PairResult.from_dict(raw if isinstance(raw, dict) else {"error": ack.reason or "no result"})
        expect, profile, _ = fleet_expectation(self._hardware)
        verdict = self._state.pairs.judge_result(result, expect, profile)
        return {
            "status": verdict.status,
            "why": "; ".join(verdict.reasons),
            "slow_senders": list(verdict.slow_senders),
            "result": result.as_dict(),
        }
