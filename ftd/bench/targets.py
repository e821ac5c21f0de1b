"""Every benchmark's documented targets, in one place, and the verdict of one run against them.

What: :data:`TARGETS` maps a bench name (``ftd bench NAME``) to its :class:`Targets`: the sentence
docs/architecture.md §10's table prints in its *target* column (a unit test checks the table against
it word for word) and the :class:`Check` s that sentence means, each a figure of the bench's result
compared with a limit. :func:`judge` (pure: a result and the targets in, a :class:`Verdict` out) is
what ``ftd bench NAME --check`` runs: a target missed, or a figure the run did not produce, fails
(gates fail closed: a figure that could not be measured is not a pass), and the command exits 1.

Why apart: benches measure; the targets were only text printed beside the figures, so a bench
could miss every one and still exit 0, and the docs' table drifted from what was printed. One
module holds both the words and the numbers, and the judging is tested without running a bench.

A check's ``figure`` is a dotted path into the result (``in_allocation.first_step_s``); ``*``
stands for every item of a list or every value of a mapping at that point (every round, every
slipped event): each must meet the limit, and none at all is *not measured*. ``limit`` is a number,
a bool or a string (``==`` only), or a :class:`Figure` naming another figure of the same result
(``takeover_s <= lease_ttl_s + 1``).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TARGETS", "Check", "Figure", "Outcome", "Targets", "Verdict", "judge"]

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    "==": operator.eq,
}


@dataclass(frozen=True)
class Figure:
    """A limit read from the result itself: the figure at ``path`` plus ``plus``."""

    path: str
    plus: float = 0.0

    def __str__(self) -> str:
        return self.path + (f" + {self.plus:g}" if self.plus else "")


Limit = float | int | bool | str | Figure


@dataclass(frozen=True)
class Check:
    """``figure`` ``op`` ``limit`` (see the module docstring)."""

    figure: str
    op: str
    limit: Limit

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"unknown comparison {self.op!r}: one of {', '.join(_OPS)}")
        if isinstance(self.limit, str) and self.op != "==":
            raise ValueError("a text limit is compared with == only")

    def __str__(self) -> str:
        return f"{self.figure} {self.op} {_show(self.limit)}"


@dataclass(frozen=True)
class Targets:
    """One bench's target sentence (docs/architecture.md §10) and the checks it means."""

    text: str
    checks: tuple[Check, ...]


@dataclass(frozen=True)
class Outcome:
    """One check against one run: the values found (one per ``*`` item) and whether it was met;
    ``met`` is None when the figure was not measured (which fails the verdict)."""

    check: Check
    values: tuple[Any, ...]
    met: bool | None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        value: Any = self.values[0] if len(self.values) == 1 else list(self.values)
        out = {"check": str(self.check), "value": value, "met": self.met}
        if self.note:
            out["note"] = self.note
        return out


@dataclass(frozen=True)
class Verdict:
    bench: str
    target: str
    outcomes: tuple[Outcome, ...] = field(default_factory=tuple)

    @property
    def met(self) -> bool:
        """Every check met; a bench with no checks is never judged met."""
        return bool(self.outcomes) and all(o.met is True for o in self.outcomes)

    @property
    def exit_code(self) -> int:
        return 0 if self.met else 1

    def missed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.met is not True]

    def as_dict(self) -> dict[str, Any]:
        return {
            "bench": self.bench,
            "target": self.target,
            "met": self.met,
            "checks": [o.as_dict() for o in self.outcomes],
        }

    def lines(self) -> list[str]:
        """The verdict as text, one line per check, then the overall one."""
        out = []
        for o in self.outcomes:
            word = {True: "met", False: "MISSED", None: "NOT MEASURED"}[o.met]
            value = o.values[0] if len(o.values) == 1 else list(o.values)
            out.append(f"{word:>12}: {o.check} (measured: {_show(value)}){' -- ' + o.note if o.note else ''}")
        out.append(f"{'verdict':>12}: {'every target met' if self.met else 'target missed'}")
        return out


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


_MISSING = object()


def _lookup(result: Any, parts: list[str]) -> Iterator[Any]:
    """Every value at the dotted ``parts`` (``*``: every item); a missing key yields nothing, a
    missing leaf yields :data:`_MISSING`."""
    if not parts:
        yield result
        return
    head, rest = parts[0], parts[1:]
    if head == "*":
        items = result.values() if isinstance(result, Mapping) else result if isinstance(result, list) else []
        for item in items:
            yield from _lookup(item, rest)
        return
    if isinstance(result, Mapping) and head in result:
        yield from _lookup(result[head], rest)
    elif isinstance(result, list) and head.isdecimal() and int(head) < len(result):
        yield from _lookup(result[int(head)], rest)
    else:
        yield _MISSING


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _limit_of(limit: Limit, result: Mapping[str, Any]) -> tuple[Any, str]:
    if not isinstance(limit, Figure):
        return limit, ""
    found = list(_lookup(result, limit.path.split(".")))
    if len(found) != 1 or not _number(found[0]):
        return _MISSING, f"limit {limit.path} not measured"
    value = found[0] + limit.plus if limit.plus else found[0]
    return value, f"limit {limit} = {_show(value)}"


def _outcome(check: Check, result: Mapping[str, Any]) -> Outcome:
    values = tuple(_lookup(result, check.figure.split(".")))
    limit, note = _limit_of(check.limit, result)
    shown = tuple(None if v is _MISSING else v for v in values)
    if not values or limit is _MISSING or any(v is _MISSING or v is None for v in values):
        return Outcome(check, shown, None, note or "not measured")
    compare = _OPS[check.op]
    if isinstance(limit, (bool, str)):
        met = all(type(v) is type(limit) and compare(v, limit) for v in values)
    else:
        if not all(_number(v) for v in values):
            return Outcome(check, shown, None, note or "not a number")
        met = all(compare(v, limit) for v in values)
    return Outcome(check, shown, met, note)


def judge(bench: str, result: Mapping[str, Any], targets: Mapping[str, Targets] | None = None) -> Verdict:
    """The verdict of one run of ``bench`` (its result as the bench returned it)."""
    known = TARGETS if targets is None else targets
    if bench not in known:
        raise KeyError(f"no targets for bench {bench!r}")
    target = known[bench]
    return Verdict(bench, target.text, tuple(_outcome(c, result) for c in target.checks))


def _c(figure: str, op: str, limit: Limit) -> Check:
    return Check(figure, op, limit)


#: Every bench's target (docs/architecture.md §10's table, the *target* column, word for word).
TARGETS: dict[str, Targets] = {
    "e2e": Targets("p50 <= 5 ms, p99 <= 25 ms", (_c("p50_ms", "<=", 5.0), _c("p99_ms", "<=", 25.0))),
    "kmsg": Targets(">= 300,000 lines/s on one core", (_c("lines_per_s", ">=", 300_000),)),
    "client": Targets("<= 20 us per step", (_c("us_per_step", "<=", 20.0),)),
    "storm": Targets(
        "<= 50 bus messages, counts exact",
        (_c("bus_messages", "<=", 50), _c("count_exact", "==", True)),
    ),
    "agent": Targets("<= 1% of a core, <= 60 MB RSS", (_c("cpu_pct", "<=", 1.0), _c("rss_mb", "<=", 60.0))),
    "coordinator": Targets(
        ">= 5,000 events/s, decision p99 <= 250 ms, 0 lost",
        (_c("events_per_s", ">=", 5_000), _c("decision_p99_ms", "<=", 250.0), _c("lost", "==", 0)),
    ),
    "chaos": Targets(
        "0 lost, 0 actions done twice", (_c("lost", "==", 0), _c("duplicated_actions", "==", 0))
    ),
    "failover": Targets(
        "takeover <= lease TTL + 1 s, 0 lost, 0 done twice, 0 side effects by a fenced leader",
        (
            _c("takeover_s", "<=", Figure("lease_ttl_s", 1.0)),
            _c("lost_events", "==", 0),
            _c("actions_done_twice", "==", 0),
            _c("fenced_side_effects", "==", 0),
        ),
    ),
    "fairness": Targets(
        "over >= 200 probes, the probes' event -> decision p99 <= 100 ms, every probe decided; "
        "the slipped Xid 79 decided within 100 ms (`flood_critical_ms`)",
        (
            _c("other_samples_during_flood", ">=", 200),
            _c("other_p99_ms", "<=", 100.0),
            _c("other_decided", "==", Figure("other_sent")),
            _c("flood_critical_decided", "==", 1),
            _c("flood_critical_ms.*", "<=", 100.0),
        ),
    ),
    "sim": Targets("< 60 s on one core", (_c("ftd_s_per_run", "<", 60.0), _c("no_ftd_s_per_run", "<", 60.0))),
    "health": Targets(
        "p99 <= 500 ms (well under 1 s), agent down too",
        (_c("cli.p99_ms", "<=", 500.0), _c("agent_down.p99_ms", "<=", 500.0)),
    ),
    "dashboard": Targets("problems query p99 <= 50 ms", (_c("problems.p99_ms", "<=", 50.0),)),
    "inventory": Targets(
        "10,000 nodes' inventories held in <= 50 MB, drift over all < 1 s, each drifted node found naming "
        "its field; 16 identical nodes: 0 conditions; a driver or VBIOS changed on 1 of 16: a condition "
        "naming it on its first report",
        (
            _c("held_mb", "<=", 50.0),
            _c("drift_s", "<", 1.0),
            _c("drifted_right", "==", True),
            _c("identical_16_conditions", "==", 0),
            _c("driver_reports_to_condition", "==", 1),
            _c("driver_named", "==", True),
            _c("vbios_reports_to_condition", "==", 1),
            _c("vbios_named", "==", True),
        ),
    ),
    "fabric": Targets(
        "a counter over its threshold: an event within two polls, every trial; one poll p99 <= 50 ms",
        (
            _c("polls_to_event", "<=", 2),
            _c("events", "==", Figure("trials")),
            _c("poll_p99_ms", "<=", 50.0),
        ),
    ),
    "scale": Targets(
        "every session held, coordinator RSS <= 500 MB, Xid event -> decision p99 <= 25 ms; "
        "all 1,000 Last Wills of the rack's nodes decided <= 10 s, 0 lost, one restart per job in the "
        "rack, none outside it",
        (
            _c("connections_held", "==", Figure("nodes")),
            _c("coordinator_rss_mb_end", "<=", 500.0),
            _c("xid_p99_ms", "<=", 25.0),
            _c("storm_all_decided", "==", True),
            _c("storm_after_grace_s", "<=", 10.0),
            _c("wills_lost", "==", 0),
            _c("jobs_in_rack_restarted_once", "==", Figure("jobs_in_rack")),
            _c("restarts_outside_rack", "==", 0),
        ),
    ),
    "recovery": Targets(
        "in-allocation first step <= 10 s and <= half the requeue path; 0 steps lost beyond the save "
        "step; 0 old-generation ranks in a new one; a rank that really stopped: resumed from the "
        "newest checkpoint, first step <= 10 s and no later than `torchrun --max-restarts`",
        (
            _c("rounds.*.in_allocation.first_step_s", "<=", 10.0),
            _c("rounds.*.ratio", "<=", 0.5),
            _c("rounds.*.in_allocation.steps_lost", "==", 0),
            _c("rounds.*.in_allocation.old_generation_ranks", "==", 0),
            _c("rounds.*.in_allocation.coordinator.path", "==", "spare"),
            _c("rounds.*.rank_killed.steps_lost", "==", 0),
            _c("rounds.*.rank_killed.old_generation_ranks", "==", 0),
            _c("rounds.*.rank_killed.first_step_s", "<=", 10.0),
            _c("rounds.*.ratio_torchrun", "<=", 1.0),
        ),
    ),
    "checkpoint": Targets(
        "training blocked per save (the overlapped snapshot: `save()` plus the next optimizer step's "
        "wait) <= 10% of a synchronous, durable `torch.save` of the same state "
        "(100 MB and 1 GB); fault cases: every resume from a checkpoint verified for every rank at the "
        "level it names, never newer than the newest verified, never a hang; a node killed mid-save: "
        "every rank at one step, from the fast levels (no shared-directory read), at most one save "
        "interval lost",
        (
            _c("blocked.100MB.overlap.ratio", "<=", 0.1),
            _c("blocked.1000MB.overlap.ratio", "<=", 0.1),
            _c("faults.results.*.right", "==", True),
            _c("faults.summary.*.hangs", "==", 0),
            _c("faults.summary.*.newer_than_verified", "==", 0),
            _c("faults.summary.*.errors", "==", 0),
            _c("faults.summary.kill_mid_save.fast_level", "==", Figure("faults.summary.kill_mid_save.runs")),
            _c(
                "faults.summary.kill_mid_save.within_interval",
                "==",
                Figure("faults.summary.kill_mid_save.runs"),
            ),
        ),
    ),
    "culprit": Targets(
        "hang with one culprit (SIGSTOP, stuck before a collective): the culprit's node named and only it "
        "excluded in every run, >= 10 runs per case, verdict <= 30 s after the hang is detected; "
        "job-wide stall and clean run: 0 exclusions, 0 swaps; one rank at half speed (a sleep per step, "
        "or its CPU quota half a core): detected <= 60 s, right node in >= 19 of 20 runs; all ranks "
        "slowed: 0 exclusions; a clean job watched 10 minutes once the detector is warm: 0 alarms (no "
        "rank_slow, hang symptom or verdict), 0 restarts; e2e p99 during a collection within 10% of without",
        (
            *(
                check
                for case in ("stopped", "stuck")
                for check in (
                    _c(f"cases.{case}.runs", ">=", 10),
                    _c(f"cases.{case}.wrong", "==", 0),
                    _c(f"cases.{case}.verdict_s_max", "<=", 30.0),
                    _c(f"cases.{case}.exclusions_max", "<=", 1),
                )
            ),
            *(
                check
                for case in ("job_wide", "clean")
                for check in (
                    _c(f"cases.{case}.wrong", "==", 0),
                    _c(f"cases.{case}.exclusions_max", "==", 0),
                    _c(f"cases.{case}.swaps_max", "==", 0),
                )
            ),
            *(
                check
                for case in ("slowed", "throttled")
                for check in (
                    _c(f"cases.{case}.runs", ">=", 20),
                    _c(f"cases.{case}.right", ">=", 19),
                    _c(f"cases.{case}.detect_s_max", "<=", 60.0),
                )
            ),
            _c("cases.slowed_all.exclusions_max", "==", 0),
            _c("cases.clean_long.runs", ">=", 1),
            _c("cases.clean_long.wrong", "==", 0),
            _c("cases.clean_long.alarms_max", "==", 0),
            _c("e2e_during_collection.p99_ratio", "<=", 1.1),
        ),
    ),
    "preemption": Targets(
        "the README's plain loop preempted with a 20 s grace and a 2 s save: >= 19 of 20 runs end with an "
        "acknowledged save that verifies on resume, at least 0.5 s before the deadline, 0 steps lost since "
        "it, the job requeued and resumed from that step; a 25 s save: no save started, the job's output "
        "says why and names the checkpoint it resumes from, in every run (>= 3), and it resumes from it; "
        "time limit (`--signal=USR1@60`) and maintenance reservation: the save lands before the limit in "
        "every run (>= 3 each); a cloud notice appearing: the save the coordinator asks for starts <= 2 s "
        "later, in every run (>= 3)",
        (
            _c("preempt.runs", ">=", 20),
            _c("preempt.ok_fraction", ">=", 0.95),
            _c("preempt.margin_min_s", ">=", 0.5),
            _c("slow_save.runs", ">=", 3),
            _c("slow_save.ok", ">=", Figure("slow_save.runs")),
            _c("time_limit.runs", ">=", 3),
            _c("time_limit.ok", ">=", Figure("time_limit.runs")),
            _c("maintenance.runs", ">=", 3),
            _c("maintenance.saved_before_deadline", ">=", Figure("maintenance.runs")),
            _c("cloud.runs", ">=", 3),
            _c("cloud.notice_to_save_max_s", "<=", 2.0),
            _c("cloud.saved_before_deadline", ">=", Figure("cloud.runs")),
        ),
    ),
    "pairs": Targets(
        "one degraded node among 16 (tc tbf 20 Mbit/s on its egress) named in <= 8 pair tests, "
        ">= 10 runs, no other node named; 0 bad nodes in 20 clean runs; pingmesh at one probe every "
        "10 s < 1% of a core per agent; 0 tests run on a training node",
        (
            _c("degraded.runs", ">=", 10),
            _c("degraded.right", ">=", Figure("degraded.runs")),
            _c("degraded.wrong", "==", 0),
            _c("degraded.tests_max", "<=", 8),
            _c("clean.runs", ">=", 20),
            _c("clean.false_findings", "==", 0),
            _c("mesh.cpu_pct_max", "<", 1.0),
            _c("training.ran", "==", 0),
        ),
    ),
}
