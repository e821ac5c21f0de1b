"""Fault mixes as data, and the traces drawn from them.

What: :func:`load_mix` reads a fault-mix file (``ftd/sim/data/*.toml``: per category a published
count and what the fault looks like on a node, each with its source; plus named job scenarios) into
:class:`FaultMix`. :func:`poisson_trace` draws one run's faults: per category, Poisson arrivals at
``count / (days x gpus)`` per GPU-second times the job's GPUs, each on a uniformly chosen node slot
of the job, with its variant (which signals it gives) drawn from the category's weights.
:func:`recorded_trace` turns a file of events written by ``ftd events export`` into faults instead.

Why: the mix is what the operator argues about, so it lives in a file they can read and change; the
simulator only reads it. Every fault carries its own random stream (``Fault.seed``), so whatever a
policy does with one fault never shifts the draws of another: policies compared in one run see the
same faults, and adding a fault to a trace leaves the others as they were.
"""

from __future__ import annotations

import math
import random
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

BUILTIN_MIXES = {"llama3": "llama3_faults.toml", "opt175b": "opt175b.toml"}
MODES = ("crash", "hang")


class MixError(ValueError):
    """A fault-mix file that cannot be used; the message names the entry and the field."""


@dataclass(frozen=True)
class Signal:
    """One event the node's agent publishes, ``at_s`` after the failure (negative: a warning)."""

    kind: str
    severity: str
    at_s: float
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Variant:
    weight: float
    mode: str  # crash | hang
    can_save: bool
    signals: tuple[Signal, ...]

    @property
    def lead_s(self) -> float:
        """How long before the failure the first signal comes (0 when none warns)."""
        return max([0.0, *(-s.at_s for s in self.signals)])


@dataclass(frozen=True)
class Category:
    name: str
    count: float
    node_fault: bool
    node_down: bool
    repair_h: float
    reset_clears: float
    silent: bool
    variants: tuple[Variant, ...]
    source: str


@dataclass(frozen=True)
class FaultMix:
    name: str
    title: str
    days: float
    gpus: int
    source: str
    categories: dict[str, Category]
    scenarios: dict[str, dict[str, Any]]

    def rate_per_gpu_s(self, category: Category) -> float:
        return category.count / (self.days * 86400.0 * self.gpus)

    def job_mtbf_s(self, job_gpus: int) -> float:
        """Mean time between faults for a job of ``job_gpus`` GPUs (every category together)."""
        total = sum(self.rate_per_gpu_s(c) for c in self.categories.values()) * job_gpus
        return math.inf if total <= 0 else 1.0 / total


@dataclass(frozen=True)
class Fault:
    """One fault of a trace: when it fails, on which slot of the job, what it looks like."""

    id: int
    t: float  # failure time (s from the start of the run)
    category: str
    variant: int
    slot: int  # index into the job's nodes; the node there at the first signal is the one hit
    seed: int  # this fault's own random stream (recurrence, reset outcome, same-node draw)
    recorded: tuple[dict[str, Any], ...] = ()  # events from a recording, replayed as-is


def _need(table: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in table:
        raise MixError(f"{where}: missing {key!r}")
    value = table[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise MixError(f"{where}: {key!r} must be {getattr(kind, '__name__', kind)}, not {value!r}")
    return value


def _signal(raw: Any, where: str) -> Signal:
    if not isinstance(raw, dict):
        raise MixError(f"{where}: a signal must be a table")
    data = {k: v for k, v in raw.items() if k not in ("kind", "severity", "at_s")}
    return Signal(
        kind=_need(raw, "kind", str, where),
        severity=_need(raw, "severity", str, where),
        at_s=float(_need(raw, "at_s", (int, float), where)),
        data=data,
    )


def _category(name: str, raw: dict[str, Any]) -> Category:
    where = f"category.{name}"
    variants = []
    for i, v in enumerate(_need(raw, "variants", list, where)):
        vw = f"{where}.variants[{i}]"
        mode = _need(v, "mode", str, vw)
        if mode not in MODES:
            raise MixError(f"{vw}: mode must be one of {', '.join(MODES)}, not {mode!r}")
        signals = tuple(_signal(s, f"{vw}.signals") for s in _need(v, "signals", list, vw))
        weight = float(_need(v, "weight", (int, float), vw))
        if weight < 0:
            raise MixError(f"{vw}: weight must be >= 0")
        variants.append(Variant(weight, mode, bool(_need(v, "can_save", bool, vw)), signals))
    if not variants or sum(v.weight for v in variants) <= 0:
        raise MixError(f"{where}: needs at least one variant with a positive weight")
    count = float(_need(raw, "count", (int, float), where))
    if count < 0:
        raise MixError(f"{where}: count must be >= 0")
    return Category(
        name=name,
        count=count,
        node_fault=_need(raw, "node_fault", bool, where),
        node_down=_need(raw, "node_down", bool, where),
        repair_h=float(_need(raw, "repair_h", (int, float), where)),
        reset_clears=float(raw.get("reset_clears", 0.0)),
        silent=bool(raw.get("silent", False)),
        variants=tuple(variants),
        source=_need(raw, "source", str, where),
    )


def parse_mix(data: dict[str, Any]) -> FaultMix:
    src = _need(data, "source", dict, "file")
    categories = {name: _category(name, raw) for name, raw in _need(data, "category", dict, "file").items()}
    return FaultMix(
        name=_need(src, "name", str, "source"),
        title=str(src.get("title", "")),
        days=float(_need(src, "days", (int, float), "source")),
        gpus=int(_need(src, "gpus", int, "source")),
        source=_need(src, "source", str, "source"),
        categories=categories,
        scenarios={k: dict(v) for k, v in data.get("scenario", {}).items()},
    )


def load_mix(name_or_path: str) -> FaultMix:
    """A built-in mix by name (``llama3``, ``opt175b``) or a TOML file by path."""
    try:
        if name_or_path in BUILTIN_MIXES:
            text = resources.files("ftd.sim").joinpath("data", BUILTIN_MIXES[name_or_path]).read_text()
        else:
            text = Path(name_or_path).read_text(encoding="utf-8")
        return parse_mix(tomllib.loads(text))
    except OSError as exc:
        raise MixError(f"{name_or_path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise MixError(f"{name_or_path}: {exc}") from None


def poisson_trace(
    mix: FaultMix, *, job_gpus: int, nodes: int, days: float, seed: int, scale: float = 1.0
) -> list[Fault]:
    """One run's faults: Poisson arrivals per category (rate scaled to ``job_gpus`` and ``scale``)."""
    horizon = days * 86400.0
    faults: list[tuple[float, str, int, int, int]] = []
    for index, category in enumerate(sorted(mix.categories.values(), key=lambda c: c.name)):
        rate = mix.rate_per_gpu_s(category) * job_gpus * scale
        rng = random.Random(f"{seed}:{index}:{category.name}")
        t = 0.0
        weights = [v.weight for v in category.variants]
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= horizon:
                break
            variant = rng.choices(range(len(weights)), weights)[0]
            faults.append((t, category.name, variant, rng.randrange(nodes), rng.getrandbits(32)))
    faults.sort()
    return [Fault(i, t, c, v, slot, s) for i, (t, c, v, slot, s) in enumerate(faults)]


def with_extra(faults: Iterable[Fault], extra: Iterable[Fault]) -> list[Fault]:
    """A trace with more faults (for comparisons); ids stay unique, order by time."""
    merged = sorted([*faults, *extra], key=lambda f: (f.t, f.id))
    return merged


# --- a recording as the trace ---------------------------------------------------------------------

HARDWARE_KINDS = frozenset(
    {"xid", "sxid", "gpu_fallen_off_bus", "gpu_health", "ecc", "row_remap", "gpu_missing", "pcie_aer",
     "ib_link", "thermal", "node_offline"}
)  # fmt: skip
CRASH_KINDS = frozenset({"xid", "gpu_fallen_off_bus", "log_pattern", "oom_kill", "ecc", "gpu_missing"})
_SEVERE = ("error", "critical")


def recorded_trace(
    lines: Iterable[bytes], *, nodes: int, job_gpus: int, window_s: float = 120.0, repair_h: float = 24.0
) -> tuple[FaultMix, list[Fault], dict[str, int]]:
    """Faults from events recorded with ``ftd events export`` (JSON lines of Event).

    Events of one node less than ``window_s`` apart are one incident; an incident with an event of
    severity error or worse is a fault at that event's time (earlier events of the incident are its
    warnings, later ones its follow-ups), on the node's slot (nodes in order of first appearance,
    wrapped onto the job's ``nodes``). The incident's first severe event names its category
    (``xid_79``, ``node_offline``, ...): a node fault when any event is a hardware kind, the node down
    for ``node_offline``, a crash when the first severe event is an Xid, a log line or an OOM kill,
    else a hang. Returns the mix (counts over the recording's span), the trace, and counts of what
    was read (``events``, ``bad_lines``, ``incidents``, ``faults``)."""
    from ftd.events import DecodeError, Event, decode

    stats = {"events": 0, "bad_lines": 0, "incidents": 0, "faults": 0}
    events: list[Event] = []
    for raw in lines:
        if not raw.strip():
            continue
        try:
            events.append(decode(raw.strip(), Event))
        except DecodeError:
            stats["bad_lines"] += 1
    stats["events"] = len(events)
    events.sort(key=lambda e: e.ts)
    if not events:
        raise MixError("the recording holds no events")
    start = events[0].ts
    slots: dict[str, int] = {}
    open_incidents: dict[str, list[Event]] = {}
    incidents: list[list[Event]] = []
    for event in events:
        slots.setdefault(event.node, len(slots) % nodes)
        current = open_incidents.get(event.node)
        if current is None or event.ts - current[-1].ts > window_s:
            current = open_incidents[event.node] = []
            incidents.append(current)
        current.append(event)
    stats["incidents"] = len(incidents)
    span_days = max(1.0, (events[-1].ts - start + 3600.0) / 86400.0)  # an hour for the last to play out
    categories: dict[str, dict[str, Any]] = {}
    raw_faults: list[tuple[float, str, int, int]] = []
    for incident in incidents:
        severe = next((e for e in incident if str(e.severity) in _SEVERE), None)
        if severe is None:
            continue
        code = severe.data.get("code")
        name = str(severe.kind) + (f"_{code}" if isinstance(code, int) else "")
        kinds = {str(e.kind) for e in incident}
        entry = categories.setdefault(
            name,
            {
                "node_fault": bool(kinds & HARDWARE_KINDS),
                "node_down": "node_offline" in kinds,
                "mode": "crash" if str(severe.kind) in CRASH_KINDS else "hang",
                "variants": [],
            },
        )
        signals = tuple(
            Signal(kind=str(e.kind), severity=str(e.severity), at_s=e.ts - severe.ts, data=dict(e.data))
            for e in incident
        )
        entry["variants"].append(Variant(1.0, entry["mode"], False, signals))
        raw_faults.append((severe.ts - start, name, len(entry["variants"]) - 1, slots[severe.node]))
    built = {
        name: Category(
            name=name,
            count=float(len(entry["variants"])),
            node_fault=entry["node_fault"],
            node_down=entry["node_down"],
            repair_h=repair_h,
            reset_clears=0.0,
            silent=False,
            variants=tuple(entry["variants"]),
            source="recording (ftd events export)",
        )
        for name, entry in categories.items()
    }
    mix = FaultMix(
        name="recorded",
        title=f"recorded events: {len(raw_faults)} faults in {span_days:.1f} days",
        days=span_days,
        gpus=job_gpus,
        source="ftd events export",
        categories=built,
        scenarios={},
    )
    raw_faults.sort()
    trace = [Fault(i, t, c, v, slot, seed=i) for i, (t, c, v, slot) in enumerate(raw_faults)]
    stats["faults"] = len(trace)
    return mix, trace, stats
