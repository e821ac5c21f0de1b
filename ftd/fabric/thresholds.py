"""Counter thresholds as data: which fabric counter is judged how, per hardware profile.

What: the catalog's ``fabric`` section (``ftd/catalog/hardware/fabric.toml``, an operator's file laid
over it) holds one table per counter, keyed ``SOURCE:NAME``::

    [default."ib:symbol_error"]
    class = "fatal"        # fatal | warning | congestion
    per_hour = 120         # judged on the increase over the last hour
    [default."ib:link_downed"]
    class = "fatal"
    any_increase = true    # one increase is enough

Sources: ``ib`` (``/sys/class/infiniband/<dev>/ports/<n>/counters``), ``hw``
(``.../hw_counters``, mlx5's RoCE counters), ``phy`` (``ethtool -S`` of the port's network device,
its ``*_phy`` counters), ``nvlink`` (NVML's NVLink error counters of a GPU, summed over its links).
A rule may also say ``per_s`` (the increase per second between two polls). :func:`rules_from_section`
turns the section into :class:`CounterRule` objects and the keys it could not read into problems (a
bad rule is a skipped check with its reason, never a silent pass); :func:`judge` gives a
:class:`Verdict` for one counter's :class:`~ftd.fabric.rates.Rate`.

Classes: ``fatal`` (a link that corrupts or drops: the node leaves the pool), ``warning`` (worth an
operator's look), ``congestion`` (the lossless fabric pushing back: PFC pause storms, ECN/CNP, out of
buffer -- the fabric, not the node or the application, is slow: never a drain, and a hang seen while
it lasts is reported with it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ftd.fabric.rates import Rate

__all__ = ["CLASSES", "SOURCES", "CounterRule", "Verdict", "judge", "rules_from_section"]

Klass = Literal["fatal", "warning", "congestion"]
CLASSES: tuple[Klass, ...] = ("fatal", "warning", "congestion")
SOURCES = ("ib", "hw", "phy", "nvlink")


@dataclass(frozen=True, slots=True)
class CounterRule:
    source: str
    counter: str
    klass: Klass
    any_increase: bool = False
    per_hour: float | None = None
    per_s: float | None = None

    @property
    def key(self) -> str:
        return f"{self.source}:{self.counter}"

    def describe(self) -> str:
        """The threshold in words (what an event's ``threshold`` says)."""
        parts = []
        if self.any_increase:
            parts.append("any increase")
        if self.per_hour is not None:
            parts.append(f"over {self.per_hour:g}/h")
        if self.per_s is not None:
            parts.append(f"over {self.per_s:g}/s")
        return " or ".join(parts)


@dataclass(frozen=True, slots=True)
class Verdict:
    rule: CounterRule
    crossed: bool
    why: str  # which limit was crossed ("any increase", "per_hour", "per_s"), or "" when none


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return float(value)


def _rule(key: str, body: Any) -> CounterRule | str:
    source, sep, counter = key.partition(":")
    if not sep or source not in SOURCES or not counter:
        return f"{key}: not SOURCE:COUNTER with SOURCE one of {', '.join(SOURCES)}"
    if not isinstance(body, Mapping):
        return f"{key}: expected a table"
    klass = body.get("class")
    if klass not in CLASSES:
        return f"{key}: class must be one of {', '.join(CLASSES)}"
    unknown = set(body) - {"class", "any_increase", "per_hour", "per_s"}
    if unknown:
        return f"{key}: unknown keys {', '.join(sorted(unknown))}"
    any_increase = body.get("any_increase", False)
    if not isinstance(any_increase, bool):
        return f"{key}: any_increase must be true or false"
    limits: dict[str, float | None] = {}
    for name in ("per_hour", "per_s"):
        raw = body.get(name)
        limits[name] = None if raw is None else _number(raw)
        if raw is not None and limits[name] is None:
            return f"{key}: {name} must be a number >= 0"
    if not any_increase and limits["per_hour"] is None and limits["per_s"] is None:
        return f"{key}: needs any_increase, per_hour or per_s"
    return CounterRule(source, counter, klass, any_increase, limits["per_hour"], limits["per_s"])


def rules_from_section(section: Mapping[str, Any]) -> tuple[dict[str, CounterRule], list[str]]:
    """The counter rules of a ``fabric`` section (keys with a ``:``), and the problems found."""
    rules: dict[str, CounterRule] = {}
    problems: list[str] = []
    for key, body in section.items():
        if ":" not in key:
            continue  # port rates and other values of the section
        made = _rule(key, body)
        if isinstance(made, str):
            problems.append(made)
        else:
            rules[made.key] = made
    return rules, problems


def judge(rule: CounterRule, rate: Rate) -> Verdict:
    """Whether ``rate`` crosses ``rule``. ``any_increase`` holds while the window (the last hour) has
    an increase, so it clears after a quiet hour; a reset's rate crosses nothing (no increase): the
    caller keeps the previous verdict over a reset."""
    if rate.reset:
        return Verdict(rule, False, "")
    if rule.any_increase and rate.window_increase > 0:
        return Verdict(rule, True, "any increase")
    if rule.per_hour is not None and rate.per_hour > rule.per_hour:
        return Verdict(rule, True, "per_hour")
    if rule.per_s is not None and rate.interval_s > 0 and rate.per_s > rule.per_s:
        return Verdict(rule, True, "per_s")
    return Verdict(rule, False, "")
