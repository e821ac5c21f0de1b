"""Which node (or link) is degraded, from as few pair tests as possible: the plan and the conclusion.

What: :class:`Bisection` is a pure planner. It is given the nodes that may be tested (idle or
drained ones), the suspects passive evidence or a slow pair points at, nodes already known good, and
a budget of tests. :meth:`Bisection.next_wave` answers the next disjoint pairs to test (disjoint, so
one wave runs at once with every node in at most one test); :meth:`Bisection.record` takes each
test's outcome (the senders whose direction was slow, from :func:`ftd.fabric.pairs.judge_pair`);
:meth:`Bisection.finding` says what the tests so far prove.

How it reasons: a pair test measures each direction apart. A direction that met its floor proves
its sender's egress and its receiver's ingress good. A slow direction ``s -> r`` is explained by
``s``'s egress or ``r``'s ingress. A node is *pinned* (confirmed) only when its fault is reproduced:
slow to two receivers (its egress) or from two senders (its ingress). One slow direction alone makes
a node *likely* (the sender, unless its egress is proven good elsewhere: traffic control and a NIC
stuck at a lower rate shape egress); while the budget lasts a confirmation test against a proven
node settles it. A slow direction whose both ends are proven good elsewhere is dismissed as not
reproduced (scheduling noise on a busy host), or, slow twice, names the link. Suspects are tested
first, each against a proven-good node when one is known; the others are then covered by disjoint
pairs. One degraded node among 16 is thus named in at most 8 tests (8 disjoint pairs; a 9th
confirms it), and a clean fleet gives no finding.

A test can also be slow as a pair while both directions met their floors: its all-reduce step (or
its round trip) was slow, which names neither side (``pair_slow``). That is reasoned the same way,
by reproduction: a node slow together with two partners is pinned (the common end); a slow pair
with one end fine with another partner makes the other end likely (a confirmation test against a
proven node settles it); with neither end tested elsewhere both are unresolved and each is tested
against a proven node; both ends fine elsewhere dismiss it (or, slow twice, name the link).

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
        #: every completed test as ``(a, b, slow as a pair)``: all-reduce or RTT, both directions fine
        self.together: list[tuple[str, str, bool]] = []
        self.tests = 0
        self._egress_ok: set[str] = set()
        self._ingress_ok: set[str] = set()
        for node in known_good:
            if node in member:
                self._egress_ok.add(node)
                self._ingress_ok.add(node)
        self._tested: set[str] = set(self._egress_ok)

    # -- recording ------------------------------------------------------------------------------

    def record(
        self, a: str, b: str, slow_senders: Iterable[str], *, failed: bool = False, pair_slow: bool = False
    ) -> None:
        """The outcome of the test ``a`` ran against ``b``: its slow senders, or that it failed;
        ``pair_slow``: the pair was slow as a whole with no sender named (its all-reduce step or its
        round trip, :func:`ftd.fabric.pairs.judge_pair`'s ``slow`` with no ``slow_senders``).

        A failed test proves nothing either way (it counts against the budget; its nodes stay
        untested unless another test covers them).
        """
        self.tests += 1
        if failed:
            self.failed.append((a, b))
            return
        slow = set(slow_senders)
        self._tested.update((a, b))
        self.together.append((a, b, pair_slow and not slow))
        for sender, receiver in ((a, b), (b, a)):
            is_slow = sender in slow
            self.observations.append(Observation(sender, receiver, is_slow))
            if not is_slow:
                self._egress_ok.add(sender)
                self._ingress_ok.add(receiver)

    # -- conclusion -----------------------------------------------------------------------------

    def _explain(self) -> tuple[list[str], dict[str, str], list[tuple[str, str]], list[str], list[str]]:
        """``(pinned, likely (node -> "egress"/"ingress"), bad links, unresolved, reasons)``.

        Pinned needs the fault reproduced: slow from one node to two receivers (its egress) or into
        one node from two senders (its ingress). One slow direction alone makes its node only likely;
        one whose every explanation other tests disproved is dismissed as not reproduced (a link
        slow twice is a bad link).
        """
        slow = [o for o in self.observations if o.slow]
        egress_to: dict[str, set[str]] = {}
        ingress_from: dict[str, set[str]] = {}
        for o in slow:
            if o.sender not in self._egress_ok:
                egress_to.setdefault(o.sender, set()).add(o.receiver)
            if o.receiver not in self._ingress_ok:
                ingress_from.setdefault(o.receiver, set()).add(o.sender)
        pinned: list[str] = []
        reasons: list[str] = []
        for node, receivers in egress_to.items():
            if len(receivers) >= 2:
                pinned.append(node)
                reasons.append(
                    f"{node}: egress slow to {len(receivers)} nodes ({', '.join(sorted(receivers))})"
                )
        for node, senders in ingress_from.items():
            if len(senders) >= 2 and node not in pinned:
                pinned.append(node)
                reasons.append(
                    f"{node}: ingress slow from {len(senders)} nodes ({', '.join(sorted(senders))})"
                )
        likely: dict[str, str] = {}
        links: list[tuple[str, str]] = []
        unresolved: list[str] = []
        for o in slow:
            if o.sender in pinned or o.receiver in pinned:
                continue
            egress_bad = o.sender not in self._egress_ok
            ingress_bad = o.receiver not in self._ingress_ok
            link = (min(o.sender, o.receiver), max(o.sender, o.receiver))
            if not egress_bad and not ingress_bad:
                repeats = sum(1 for x in slow if {x.sender, x.receiver} == set(link))
                if repeats >= 2 and link not in links:
                    links.append(link)
                    reasons.append(
                        f"link {link[0]} <-> {link[1]}: slow {repeats} times, both ends good elsewhere"
                    )
                elif repeats < 2:
                    reasons.append(f"{o.sender} -> {o.receiver} slow once, not reproduced: dismissed")
            elif egress_bad and ingress_bad and Observation(o.receiver, o.sender, True) in slow:
                for node in (o.sender, o.receiver):
                    if node not in unresolved:
                        unresolved.append(node)
                        reasons.append(f"{node}: slow both ways with its partner; which end is not known yet")
            elif egress_bad:
                if o.sender not in likely:
                    likely[o.sender] = "egress"
                    reasons.append(
                        f"{o.sender}: egress slow to {o.receiver} (unconfirmed"
                        + (f": {o.receiver}'s ingress would look the same)" if ingress_bad else ")")
                    )
            elif o.receiver not in likely:
                likely[o.receiver] = "ingress"
                reasons.append(f"{o.receiver}: ingress slow from {o.sender} (unconfirmed)")
        self._explain_together(pinned, likely, links, unresolved, reasons)
        unresolved = [n for n in unresolved if n not in likely]
        return pinned, likely, links, unresolved, reasons

    def _explain_together(
        self,
        pinned: list[str],
        likely: dict[str, str],
        links: list[tuple[str, str]],
        unresolved: list[str],
        reasons: list[str],
    ) -> None:
        """Add what the pairs slow as a whole (no sender named) say, in place: a node slow together
        with two partners is pinned; one end fine with another partner leaves the other likely
        (``"pair"``); neither end tested elsewhere leaves both unresolved; both fine elsewhere is
        dismissed, or a bad link when the pair was slow twice."""
        slow_with: dict[str, set[str]] = {}
        fine_with: dict[str, set[str]] = {}
        for a, b, slow in self.together:
            book = slow_with if slow else fine_with
            book.setdefault(a, set()).add(b)
            book.setdefault(b, set()).add(a)
        for node in sorted(slow_with):
            partners = slow_with[node]
            if len(partners) >= 2 and node not in pinned:
                pinned.append(node)
                reasons.append(
                    f"{node}: slow as a pair (all-reduce or round trip) with {len(partners)} nodes "
                    f"({', '.join(sorted(partners))}), every direction fine: the common end"
                )
        seen: set[tuple[str, str]] = set()
        for a, b, slow in self.together:
            pair = (min(a, b), max(a, b))
            if not slow or a in pinned or b in pinned or pair in seen:
                continue
            seen.add(pair)
            a_fine = bool(fine_with.get(a, set()) - {b})
            b_fine = bool(fine_with.get(b, set()) - {a})
            if a_fine and b_fine:
                repeats = sum(1 for x, y, s in self.together if s and {x, y} == {a, b})
                if repeats >= 2 and pair not in links:
                    links.append(pair)
                    reasons.append(
                        f"link {pair[0]} <-> {pair[1]}: slow as a pair {repeats} times, "
                        "both ends fine elsewhere"
                    )
                elif repeats < 2:
                    reasons.append(f"{a} <-> {b} slow as a pair once, both ends fine elsewhere: dismissed")
            elif a_fine or b_fine:
                node, other = (b, a) if a_fine else (a, b)
                if node not in likely:
                    likely[node] = "pair"
                    reasons.append(
                        f"{node}: slow as a pair with {other} (all-reduce or round trip), {other} fine with "
                        "another node (unconfirmed)"
                    )
            else:
                for node in (a, b):
                    if node not in unresolved and node not in likely:
                        unresolved.append(node)
                        reasons.append(
                            f"{node}: slow as a pair with {b if node == a else a} (all-reduce or round trip, "
                            "every direction fine); which end is not known yet"
                        )

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
        slow both ways (against a proven-good node). A slow suspect is confirmed and nothing else is
        covered; a clean one leaves the rest to cover.
        """
        left = self.budget - self.tests
        if left <= 0:
            return []
        busy: set[str] = set()
        wave: list[tuple[str, str]] = []
        pinned, likely, _links, unresolved, _ = self._explain()
        suspect = {*pinned, *likely, *unresolved}  # a pair-slow node's directions may all be fine
        slow_together = {n for a, b, slow in self.together if slow for n in (a, b)}
        good = [n for n in self.nodes if n in self._egress_ok and n in self._ingress_ok and n not in suspect]

        def proven_partner(node: str, avoid: set[str]) -> str | None:
            return next((o for o in good if o != node and o not in busy and o not in avoid), None)

        def confirming_partner(node: str, way: str) -> str | None:
            # a node proven good both ways settles ``node``; failing that, one proven on the side that
            # matters (ingress to confirm an egress, egress to confirm an ingress), then any other
            if way == "egress":
                tried = {o.receiver for o in self.observations if o.sender == node}
                side = self._ingress_ok
            elif way == "pair":  # slow together with its partner: another partner settles it
                tried = {o.receiver for o in self.observations if o.sender == node}
                side = set(good)
            else:
                tried = {o.sender for o in self.observations if o.receiver == node}
                side = self._egress_ok
            free = [
                o for o in self.nodes if o != node and o not in busy and o not in tried and o not in pinned
            ]
            return (
                next((o for o in free if o in good), None)
                or next((o for o in free if o in side), None)
                or next(iter(free), None)
            )

        failed_nodes = {n for pair in self.failed for n in pair}
        untested = [n for n in self.nodes if n not in self._tested and n not in failed_nodes]
        suspects = [n for n in self.suspects if n in untested]
        if suspects:
            pending = suspects
        elif self.suspects and (pinned or likely or unresolved):
            pending = []  # the suspects are tested and one is slow: confirm it, cover nothing more
        else:
            pending = untested
        # coverage first: confirmations only take the tests the untested nodes leave
        spare = left - (len(pending) + 1) // 2
        for node in [*likely, *unresolved]:
            if len(wave) >= spare or node in busy:
                continue
            tried = {o.receiver for o in self.observations if o.sender == node}
            other = (
                proven_partner(node, tried) if node in unresolved else confirming_partner(node, likely[node])
            )
            if other is None and node in unresolved and node in slow_together:
                # no node proven yet: any other that is no suspect (slow with it too pins this one)
                other = next((o for o in self.nodes if o != node and o not in busy | tried | suspect), None)
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
