"""A hot spare is pair-tested against the nodes of the job it would join, before it joins (issue #35).

What: :class:`SpareTests` is asked by the in-allocation restart (:mod:`.restart_phase`) once a
swap is planned and before its generation is sent. For each spare the plan puts in a slot, it picks
the job's slot nodes next to that slot (the spare's neighbours in the ring its ranks join, at most
``peers`` of them, never another spare of the same plan) and has the spare's agent run a pair test
against each (:class:`~ftd.coordinator.actions.pair_test.PairTest`'s directive and judgement). A
spare whose test is slow (on its side) or does not complete is *unfit*, with why; the restart plans
again without it (another spare, or the scheduler requeue). Every result goes to the action's
``detail["spare_tests"]`` (persisted with the attempt: a resumed restart does not test again).

Why now and not earlier: a node that trains takes part in no pair test, and the job's nodes train
until the job stops. Between the stop and the new generation they run no rank -- their supervisors
say ``stopped``, the spare's ``idle`` -- and that is what the agents' busy check reads
(:func:`ftd.agent.pair_tests.service.training_jobs`), so the test runs in that window and only then.
A peer that still refuses as training (its supervisor's ``stopped`` not yet reported) is asked again
until ``busy_wait_s``; past it the spare is untested, and an untested spare is not chosen (fails
closed). A test that completed but cannot be judged (no hardware profile and no fleet baseline yet)
does not hold the spare back, and says so.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from ftd.coordinator.actions.pair_test import PairTest
from ftd.logs import get_logger
from ftd.plugin.actions import ActionRecord

__all__ = ["SpareTests", "neighbours"]

log = get_logger(__name__)

#: The agents' refusal while a job trains there (ftd.agent.pair_tests.service.training).
_TRAINING = "training (job"


def neighbours(slots: Sequence[str], index: int, avoid: set[str], count: int) -> list[str]:
    """The slot nodes next to slot ``index`` (after it, before it, then further out), skipping
    ``avoid`` and repeats; at most ``count``."""
    out: list[str] = []
    n = len(slots)
    for distance in range(1, n):
        for sign in (1, -1):
            node = slots[(index + sign * distance) % n]
            if node not in avoid and node not in out and node != slots[index]:
                out.append(node)
            if len(out) >= count:
                return out
    return out


class SpareTests:
    def __init__(self, pair_test: PairTest, *, peers: int = 2, busy_wait_s: float = 10.0) -> None:
        self.pair_test = pair_test
        self.peers = peers
        self.busy_wait_s = busy_wait_s
        self.retry_s = 0.5

    async def unfit(self, record: ActionRecord) -> dict[str, str]:
        """Test each spare the plan in ``record.detail`` swaps in; the spares that must not join, with
        why. Results are kept in ``detail["spare_tests"]`` by spare (tested once per action)."""
        detail = record.detail
        slots = [str(n) for n in detail.get("slots") or []]
        swapped = {str(k): str(v) for k, v in (detail.get("swapped") or {}).items()}
        tested: dict[str, Any] = detail.setdefault("spare_tests", {})
        spares = set(swapped.values())
        unfit: dict[str, str] = {}
        for spare in sorted(spares):
            done = tested.get(spare)
            if not isinstance(done, dict):
                index = slots.index(spare) if spare in slots else -1
                peers = neighbours(slots, index, spares, self.peers) if index >= 0 else []
                began = time.monotonic()
                done = await self._test(record, spare, peers)
                done["seconds"] = round(time.monotonic() - began, 3)
                tested[spare] = done
            if done.get("fit") is not True:
                unfit[spare] = str(done.get("why") or "its pair test did not pass")
        return unfit

    async def _test(self, record: ActionRecord, spare: str, peers: list[str]) -> dict[str, Any]:
        if not peers:
            return {"fit": True, "why": "no other slot node to test against", "results": []}
        results: list[dict[str, Any]] = []
        notes: list[str] = []
        for peer in peers:
            outcome = await self._one(record, spare, peer)
            results.append(outcome)
            if outcome["status"] == "pass":
                continue
            slow = outcome.get("slow_senders") or []
            if outcome["status"] == "slow" and slow and spare not in slow:
                notes.append(f"with {peer}: {peer}'s own egress was the slow side, not {spare}'s")
                continue
            if outcome["status"] == "skipped":
                notes.append(f"with {peer}: not judged ({outcome['why']})")
                continue
            why = f"pair test with {peer} {outcome['status']}: {outcome['why']}"
            log.warning("spare_test_failed", job=record.request.target, spare=spare, peer=peer, why=why)
            return {"fit": False, "why": why, "results": results}
        why = f"pair tests with {', '.join(peers)} passed" + (f" ({'; '.join(notes)})" if notes else "")
        log.info("spare_tested", job=record.request.target, spare=spare, peers=peers, why=why)
        return {"fit": True, "why": why, "results": results}

    async def _one(self, record: ActionRecord, spare: str, peer: str) -> dict[str, Any]:
        """One test spare -> peer; a peer still refusing as training is asked again until busy_wait_s."""
        give_up = time.monotonic() + self.busy_wait_s
        attempt = 0
        while True:
            attempt += 1
            suffix = f"spare-test-{spare}-{peer}-{attempt}"
            # the TCP phases only: the job waits for this test, and an all-reduce step costs seconds
            outcome = await self.pair_test.measure(record, spare, peer, suffix=suffix, allreduce=False)
            error = str((outcome.get("result") or {}).get("error") or "")
            if outcome["status"] == "failed" and _TRAINING in error and time.monotonic() < give_up:
                await asyncio.sleep(self.retry_s)
                continue
            outcome["attempts"] = attempt
            return outcome
