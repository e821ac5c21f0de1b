"""Which node (or link) is degraded, from as few pair tests as possible: the plan and the conclusion.

What: :class:`Bisection` is a pure planner. It is given the nodes that may be tested (idle or
drained ones), the suspects passive evidence or a slow pair points at, nodes already known good, and
a budget of tests. :meth:`Bisection.next_wave` answers the next disjoint pairs to test (disjoint, so
one wave runs at once with every node in at most one test); :meth:`Bisection.record` takes each
test's outcome (the senders whose direction was slow, from :func:`ftd.fabric.pairs.judge_pair`);
:meth:`Bisection.finding` says what the tests so far prove.

How it reasons: a pair test measures each direction apart. A direction that met its floor proves
its sender's egress and its receiver's ingress good. A slow direction ``s -> r`` is explained by
``s``'s egress or ``r``'s ingress; when one of the two is already proven good, the other is pinned
(``confirmed``); when both ends are proven good elsewhere, the link between them is. When neither
is, the sender is named as the likely culprit (traffic control and a NIC stuck at a lower rate shape
egress) and, while the budget lasts, a confirmation test against a node whose ingress is proven
good settles it. Suspects are tested first, each against a proven-good node when one is known; the
others are then covered by disjoint pairs. One degraded node among 16 is thus named in at most 8
tests (8 disjoint pairs; a 9th confirms it), and a clean fleet gives no finding.

Why pure: the coordinator runs it against live agents, the bench and the property tests against
measured or generated outcomes; all get the same answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Bisection", "Finding", "Observation"]


@dataclass(frozen=True)
class Observation:
    """One direction of one test: ``sender -> receiver`` was slow or not."""

    sender: str
    receiver: str
    slow: bool


@dataclass(frozen=True)
class Finding:
    """What the tests so far say: pinned nodes, likely ones (unconfirmed), bad links, untested nodes."""

    bad_nodes: tuple[str, ...]
    confirmed: bool
    bad_links: tuple[tuple[str, str], ...] = ()
    unresolved: tuple[str, ...] = ()
    untested: tuple[str, ...] = ()
    tests: int = 0
    reasons: tuple[str, ...] = field(default_factory=tuple)

    @property
    def clean(self) -> bool:
        return not self.bad_nodes and not self.bad_links and not self.unresolved

    def as_dict(self) -> dict[str, Any]:
        return {
            "bad_nodes": list(self.bad_nodes),
            "confirmed": self.confirmed,
            "bad_links": [list(link) for link in self.bad_links],
            "unresolved": list(self.unresolved),
            "untested": list(self.untested),
            "tests": self.tests,
            "reasons": list(self.reasons),
        }


class Bisection:
    """A bisection's state: the plan of the next wave and the conclusion of the tests recorded."""

    def __init__(
        self,
        nodes: Sequence[str],
        *,
        suspects: Iterable[str] = (),
        known_good: Iterable[str] = (),
        budget: int | None = None,
    ) -> None:
        self.nodes = tuple(dict.fromkeys(nodes))
        member = set(self.nodes)
        self.suspects = tuple(s for s in dict.fromkeys(suspects) if s in member)
        self.budget = budget if budget is not None else (len(self.nodes) + 1) // 2 + 2
        self.observations: list[Observation] = []
        self.failed: list[tuple[str, str]] = []
        self.tests = 0
        self._egress_ok: set[str] = set()
        self._ingress_ok: set[str] = set()
        for node in known_good:
            if node in member:
                self._egress_ok.add(node)
                self._ingress_ok.add(node)
        self._tested: set[str] = set(self._egress_ok)

    # -- recording ------------------------------------------------------------------------------

    def record(self, a: str, b: str, slow_senders: Iterable[str], *, failed: bool = False) -> None:
        """The outcome of the test ``a`` ran against ``b``: its slow senders, or that it failed.

        A failed test proves nothing either way (it counts against the budget; its nodes stay
        untested unless another test covers them).
        """
        self.tests += 1
        if failed:
            self.failed.append((a, b))
            return
        slow = set(slow_senders)
        self._tested.update((a, b))
        for sender, receiver in ((a, b), (b, a)):
            is_slow = sender in slow
            self.observations.append(Observation(sender, receiver, is_slow))
            if not is_slow:
                self._egress_ok.add(sender)
                self._ingress_ok.add(receiver)

    # -- conclusion -----------------------------------------------------------------------------

    def _explain(self) -> tuple[list[str], list[str], list[tuple[str, str]], list[str], list[str]]:
        """``(pinned, likely, bad links, unresolved, reasons)`` from the observations so far."""
        pinned: list[str] = []
        likely: list[str] = []
        links: list[tuple[str, str]] = []
        unresolved: list[str] = []
        reasons: list[str] = []
        slow = [o for o in self.observations if o.slow]
        ambiguous: list[Observation] = []
        for obs in slow:
            egress_bad = obs.sender not in self._egress_ok
            ingress_bad = obs.receiver not in self._ingress_ok
            if egress_bad and ingress_bad:
                ambiguous.append(obs)
            elif egress_bad:
                if obs.sender not in pinned:
                    pinned.append(obs.sender)
                    reasons.append(
                        f"{obs.sender}: egress slow to {obs.receiver}, whose ingress is proven good"
                    )
            elif ingress_bad:
                if obs.receiver not in pinned:
                    pinned.append(obs.receiver)
                    reasons.append(
                        f"{obs.receiver}: ingress slow from {obs.sender}, whose egress is proven good"
                    )
            else:
                link = (min(obs.sender, obs.receiver), max(obs.sender, obs.receiver))
                if link not in links:
                    links.append(link)
                    reasons.append(f"link {link[0]} <-> {link[1]}: slow though both ends are good elsewhere")
        both_ways = {
            frozenset((o.sender, o.receiver))
            for o in ambiguous
            if Observation(o.receiver, o.sender, True) in ambiguous
        }
        for obs in ambiguous:
            if obs.sender in pinned or obs.receiver in pinned:
                continue
            receivers = {o.receiver for o in ambiguous if o.sender == obs.sender}
            senders = {o.sender for o in ambiguous if o.receiver == obs.receiver}
            if len(receivers) >= 2 and obs.sender not in self._egress_ok:
                pinned.append(obs.sender)
                reasons.append(f"{obs.sender}: egress slow to {len(receivers)} nodes (one fault explains it)")
                continue
            if len(senders) >= 2 and obs.receiver not in self._ingress_ok:
                pinned.append(obs.receiver)
                reasons.append(
                    f"{obs.receiver}: ingress slow from {len(senders)} nodes (one fault explains it)"
                )
                continue
            if frozenset((obs.sender, obs.receiver)) in both_ways:
                for node in (obs.sender, obs.receiver):
                    if node not in unresolved:
                        unresolved.append(node)
                        reasons.append(f"{node}: slow both ways with its partner; which end is not known yet")
            elif obs.sender not in likely:
                likely.append(obs.sender)
                reasons.append(
                    f"{obs.sender}: egress slow to {obs.receiver} (unconfirmed: {obs.receiver}'s ingress "
                    "would look the same)"
                )
        return pinned, likely, links, unresolved, reasons

    def finding(self) -> Finding:
        pinned, likely, links, unresolved, reasons = self._explain()
        bad = tuple(dict.fromkeys([*pinned, *likely]))
        return Finding(
            bad_nodes=bad,
            confirmed=not likely and not unresolved,
            bad_links=tuple(links),
            unresolved=tuple(n for n in unresolved if n not in bad),
            untested=tuple(n for n in self.nodes if n not in self._tested),
            tests=self.tests,
            reasons=tuple(reasons),
        )

    # -- planning -------------------------------------------------------------------------------

    def next_wave(self) -> list[tuple[str, str]]:
        """The next disjoint pairs to test (``[]``: finished, or the budget is spent).

        The untested suspects (or, once they are tested and nothing is pinned, the untested rest)
        come first, each against a free proven-good node, else another untested one; the tests they
        leave confirm what is only likely (against a node whose ingress is proven) or resolve a pair
        slow both ways (against a proven-good node). A pinned suspect ends it.
        """
        left = self.budget - self.tests
        if left <= 0:
            return []
        busy: set[str] = set()
        wave: list[tuple[str, str]] = []
        pinned, likely, _links, unresolved, _ = self._explain()
        good = [n for n in self.nodes if n in self._egress_ok and n in self._ingress_ok and n not in pinned]

        def proven_partner(node: str, avoid: set[str]) -> str | None:
            return next((o for o in good if o != node and o not in busy and o not in avoid), None)

        def confirming_partner(node: str) -> str | None:
            # a node whose ingress is proven settles ``node``'s egress; failing that, any node it has
            # not been tested with (a second slow receiver is explained by one fault only: its egress)
            tried = {o.receiver for o in self.observations if o.sender == node}
            free = [
                o for o in self.nodes if o != node and o not in busy and o not in tried and o not in pinned
            ]
            return next((o for o in free if o in self._ingress_ok), None) or next(iter(free), None)

        failed_nodes = {n for pair in self.failed for n in pair}
        untested = [n for n in self.nodes if n not in self._tested and n not in failed_nodes]
        suspects = [n for n in self.suspects if n in untested]
        if suspects:
            pending = suspects
        elif pinned and all(s in self._tested for s in self.suspects) and self.suspects:
            pending = []
        else:
            pending = untested
        # coverage first: confirmations only take the tests the untested nodes leave
        spare = left - (len(pending) + 1) // 2
        for node in [*likely, *unresolved]:
            if len(wave) >= spare or node in busy:
                continue
            tried = {o.receiver for o in self.observations if o.sender == node}
            other = proven_partner(node, tried) if node in unresolved else confirming_partner(node)
            if other is not None:
                wave.append((node, other))
                busy.update((node, other))
        pending = [n for n in pending if n not in busy]
        while pending and len(wave) < left:
            node = pending.pop(0)
            other = proven_partner(node, set())
            if other is None:
                other = next((n for n in pending if n not in busy), None)
                if other is not None:
                    pending.remove(other)
            if other is None:
                other = next((n for n in self.nodes if n != node and n not in busy and n not in pinned), None)
            if other is None:
                break
            wave.append((node, other))
            busy.update((node, other))
        return wave
