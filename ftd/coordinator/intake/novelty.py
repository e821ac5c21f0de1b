"""Never fold novelty: which of a flooding node's events are decided anyway.

A node over its rate (:mod:`ftd.coordinator.intake.fairness`) has the excess *folded*: counted in its
``bad_input`` summary and receipted, never evaluated. That is right for the thousandth copy of one
fault and wrong for a different fault hidden in the flood: a buggy agent's Xid 43 storm must not
hide the Xid 79 of a GPU that fell off the bus in the middle of it. So, over the rate:

* anything **critical** is evaluated: severity ``critical``, or an Xid whose catalog entry is
  ``fatal`` (79, 48, 74, ...: :func:`~ftd.catalog.load_xid_catalog`), or a GPU fallen off the bus;
* the **first event of a signature** not seen over the rate from that node in the current window is
  evaluated; later ones of that signature are folded (so a flood of one fault costs one evaluation
  per window beyond the node's burst). The signature is what the fault is
  (:func:`signature_of`: kind, Xid/SXid code, log pattern or health signal), not its id or time.

:class:`Novelty` is the per-node book of signatures seen: a window opens at a node's first event
over its rate and lasts ``window_s`` (as the ``bad_input`` summary's window); a node gets at most
``max_signatures`` novel evaluations per window, so a flood of ever-new signatures is folded
beyond that (critical events still are not). Pure bookkeeping on an injected clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ftd.catalog import load_xid_catalog
from ftd.events import Event, Kind, Severity

WINDOW_S = 60.0  # as the bad_input summary's window (fairness.WINDOW_S)
MAX_SIGNATURES = 64  # novel signatures per node and window evaluated over the rate; more are folded
_MAX_PART = 64  # characters of a pattern or signal name kept in a signature

Signature = tuple[str, int | None, str]


def signature_of(event: Event) -> Signature:
    """What the fault is, wherever and whenever: the kind, the Xid/SXid code, and the log pattern
    (``log_pattern``) or health signal (``gpu_health``, ``ecc``, ...) it names."""
    data = event.data
    code = data.get("code")
    detail = data.get("pattern") if event.kind == Kind.LOG_PATTERN else data.get("signal")
    return (
        str(event.kind),
        code if isinstance(code, int) and not isinstance(code, bool) else None,
        detail[:_MAX_PART] if isinstance(detail, str) else "",
    )


def _fatal_xids() -> frozenset[int]:
    return frozenset(code for code, info in load_xid_catalog().entries.items() if info.fatal)


def is_critical(event: Event, fatal_xids: frozenset[int] | None = None) -> bool:
    """Severity critical, a GPU fallen off the bus, or an Xid the catalog calls fatal."""
    if event.severity == Severity.CRITICAL or event.kind == Kind.GPU_FALLEN_OFF_BUS:
        return True
    if event.kind != Kind.XID:
        return False
    code = event.data.get("code")
    return isinstance(code, int) and code in (fatal_xids if fatal_xids is not None else _fatal_xids())


@dataclass
class _Seen:
    start: float
    signatures: set[Signature] = field(default_factory=set)


class Novelty:
    """Per node: the signatures seen over its rate in the current window (see the module doc)."""

    def __init__(
        self,
        *,
        window_s: float = WINDOW_S,
        max_signatures: int = MAX_SIGNATURES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s, self.max_signatures, self.clock = window_s, max_signatures, clock
        self.fatal_xids = _fatal_xids()
        self._seen: dict[str, _Seen] = {}
        self.evaluated_critical = 0  # over-rate events evaluated because they were critical
        self.evaluated_novel = 0  # ... because their signature was new in the window

    def must_evaluate(self, event: Event) -> bool:
        """Whether ``event``, over its node's rate, is decided anyway (critical, or a new signature);
        a new signature is remembered for the rest of the node's window."""
        if is_critical(event, self.fatal_xids):
            self.evaluated_critical += 1
            return True
        now = self.clock()
        seen = self._seen.get(event.node)
        if seen is None or now - seen.start >= self.window_s:
            if len(self._seen) >= 4096:  # forget closed windows now and then: as many as nodes flooding
                self._seen = {n: s for n, s in self._seen.items() if now - s.start < self.window_s}
            seen = self._seen[event.node] = _Seen(now)
        signature = signature_of(event)
        if signature in seen.signatures or len(seen.signatures) >= self.max_signatures:
            return False
        seen.signatures.add(signature)
        self.evaluated_novel += 1
        return True

    def __len__(self) -> int:
        return len(self._seen)
