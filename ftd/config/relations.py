"""Rules between options that no single option's type or bounds can express.

What: :func:`check_relations` returns a :class:`~ftd.config.errors.Problem` for each broken rule:

- exclusive or dependent options: ``bus.password`` vs ``bus.password_file``, a user name needs a
  password and a password a user name, ``bus.ca_file`` needs ``bus.tls``, ``bus.rack_broker`` is
  not for an embedded broker, ``coordinator.notify``'s
  ``webhook_url`` vs ``url_file``, ``coordinator.ha.ledger = "postgresql"`` needs ``ha.dsn``; the
  same user name / password rules for the HA standby's login (``coordinator.ha.standby_username``,
  ``standby_password_file``), which only a PostgreSQL ledger uses;
- orderings: ``bus.reconnect_min_s <= reconnect_max_s``; per ``agent.fs.mounts`` entry
  ``warn_pct < critical_pct`` and ``agent.fs.hysteresis_pct < warn_pct`` (or a warning never
  clears); ``agent.memory.available_critical_pct < available_warn_pct``;
  ``agent.nvml.temperature_hysteresis_c < temperature_c``; ``agent.heartbeat.check_interval_s <
  timeout_s``; ``coordinator.ha.renew_interval_s < lease_ttl_s``;
- windows that must hold enough samples: ``agent.fs.forecast_window_s`` ``forecast_min_samples`` samples
  (and ``forecast_min_span_s``) taken every
  ``interval_s`` (the fill-rate fit's minimum), ``agent.memory.leak_window_s``
  ``leak_min_samples`` of them;
- references inside the file: one ``coordinator.policy.rate_limits`` entry per action kind (a
  second silently replaced the first), and a ``policy.domain_budgets`` label must be set by some
  ``coordinator.node_labels`` entry (otherwise the budget never applies).

Why on the raw data, before the structs are built: an operator should see these together with the
type errors, in one run. So every rule reads values leniently (a value of the wrong type is already
reported by the validator and is skipped here), uses the schema's default for an option left out,
and reports the option the file *set*, saying when the other side is a default ("must not exceed
bus.reconnect_max_s (10.0, the default), got 20").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from ftd.config.credentials import STANDBY_OPTIONS
from ftd.config.errors import Problem
from ftd.config.schema import (
    NODE_LABELS,
    BusConfig,
    CoordinatorConfig,
    FsConfig,
    FsMount,
    HaConfig,
    HeartbeatConfig,
    MemoryConfig,
    NvmlConfig,
)

__all__ = ["check_relations"]


def check_relations(data: Mapping[Any, Any]) -> list[Problem]:
    """Every broken rule between options of ``data`` (parsed TOML), each at the option to change."""
    problems = [*_credentials(data), *_orderings(data), *_windows(data), *_policy(data)]
    return [p for p in problems if p is not None]


# --------------------------------------------------------------------------------------------------
# Reading raw values


def _table(data: Mapping[Any, Any], *keys: str) -> Mapping[Any, Any]:
    """The table at ``keys`` (``{}`` when missing or not a table: the validator reports that)."""
    for key in keys:
        value = data.get(key)
        if not isinstance(value, dict):
            return {}
        data = value
    return data


@dataclass(frozen=True)
class _Value:
    """One option's number as the daemon would see it: set in the file, or the schema's default."""

    path: str
    value: float
    given: bool

    def shown(self) -> str:
        return f"{self.path} ({self.value}{'' if self.given else ', the default'})"


def _value(table: Mapping[Any, Any], prefix: str, key: str, defaults: msgspec.Struct) -> _Value | None:
    """``None`` when the file's value is not a finite number (a type error, reported elsewhere)."""
    given = key in table
    value = table[key] if given else getattr(defaults, key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return _Value(f"{prefix}.{key}", value, given)


def _order(low: _Value | None, high: _Value | None, *, strict: bool, why: str = "") -> Problem | None:
    """``low < high`` (``strict``) or ``low <= high``; reported at ``low`` unless only ``high`` was set."""
    if low is None or high is None or (low.value < high.value if strict else low.value <= high.value):
        return None
    if low.given or not high.given:
        word = "must be below" if strict else "must not exceed"
        return Problem(low.path, f"{word} {high.shown()}, got {low.value}{why}")
    word = "must be above" if strict else "must not be below"
    return Problem(high.path, f"{word} {low.shown()}, got {high.value}{why}")


def _must_span(
    window: _Value | None, samples: _Value | int | None, every: _Value | None, consequence: str
) -> Problem | None:
    """``window`` must hold ``samples`` samples taken ``every`` seconds: ``(samples - 1) * every``."""
    if window is None or samples is None or every is None:
        return None
    count = samples if isinstance(samples, int) else samples.value
    need = (count - 1) * every.value
    if window.value >= need:
        return None
    sides = [window, every] + ([] if isinstance(samples, int) else [samples])
    where = next((side for side in sides if side.given), window)  # the option the file set
    counted = str(count) if isinstance(samples, int) or samples is where else samples.shown()
    if where is window:
        message = f"must span {counted} samples taken every {every.shown()}: at least {need:g} s"
        return Problem(where.path, f"{message}, got {window.value}; {consequence}")
    interval = f"{every.value:g} s" if every is where else every.shown()
    message = f"{counted} samples taken every {interval} span {need:g} s, more than {window.shown()}"
    return Problem(where.path, f"{message}; {consequence}")


# --------------------------------------------------------------------------------------------------
# The rules


def _credentials(data: Mapping[Any, Any]) -> Iterator[Problem | None]:
    notify = _table(data, "coordinator", "notify")
    if None not in (notify.get("webhook_url"), notify.get("url_file")):
        yield Problem("coordinator.notify.url_file", "mutually exclusive with webhook_url; keep one of them")
    destinations = notify.get("destinations")
    for i, dest in enumerate(destinations if isinstance(destinations, list) else []):
        if not isinstance(dest, dict):
            continue
        where = f"coordinator.notify.destinations[{i}]"
        if None not in (dest.get("webhook_url"), dest.get("url_file")):
            yield Problem(f"{where}.url_file", "mutually exclusive with webhook_url; keep one of them")
        elif dest.get("webhook_url") is None and dest.get("url_file") is None:
            yield Problem(where, "needs webhook_url or url_file: where should notifications go?")
    bus = _table(data, "bus")
    yield from _login(bus, lambda key: f"bus.{key}")
    if bus.get("ca_file") is not None and bus.get("tls") is not True:
        yield Problem("bus.ca_file", "is set but bus.tls is not true; set tls = true or remove it")
    if bus.get("rack_broker") is not None and bus.get("embedded") is True:
        yield Problem(
            "bus.rack_broker", "is set but bus.embedded is true: an in-process broker has no bridge"
        )
    ha = _table(data, "coordinator", "ha")
    if ha.get("ledger") == "postgresql" and ha.get("dsn") is None:
        yield Problem("coordinator.ha.dsn", "ledger = postgresql needs the database's connection string")
    # The standby view's login: the same rules as the bus's, on the options that replace bus.*.
    standby = {field: ha.get(option) for option, field in STANDBY_OPTIONS.items()}
    yield from _login(
        standby, {field: f"coordinator.ha.{option}" for option, field in STANDBY_OPTIONS.items()}.get
    )
    given = [f"coordinator.ha.{option}" for option in STANDBY_OPTIONS if ha.get(option) is not None]
    if given and ha.get("ledger") != "postgresql":
        yield Problem(given[0], "is set but coordinator.ha.ledger is not postgresql (no standby to use it)")


def _login(table: Mapping[Any, Any], path: Callable[[str], str | None]) -> Iterator[Problem]:
    """A user name and its password, in ``table`` (``bus``'s keys); ``path(key)`` is the option's
    dotted path (``None``: the option does not exist there, e.g. the standby's inline password)."""

    def given(key: str) -> bool:
        return table.get(key) is not None

    def at(key: str) -> str:
        return path(key) or key

    if given("password") and given("password_file"):
        yield Problem(at("password_file"), f"mutually exclusive with {at('password')}; keep one of them")
    if given("username") and not (given("password") or given("password_file")):
        yield Problem(at("username"), f"a user name needs a password: set {at('password_file')}")
    if not given("username") and (given("password") or given("password_file")):
        key = "password" if given("password") else "password_file"
        yield Problem(at(key), f"a password needs {at('username')} (MQTT sends none without a user name)")


#: Pairs of options of one table that must be ordered: (table, its defaults, the lower option, the
#: higher one, strictly, what goes wrong otherwise).
_ORDERS: tuple[tuple[str, msgspec.Struct, str, str, bool, str], ...] = (
    ("bus", BusConfig(), "reconnect_min_s", "reconnect_max_s", False, ""),
    (
        "agent.nvml",
        NvmlConfig(),
        "temperature_hysteresis_c",
        "temperature_c",
        True,
        " (a hot GPU would never count as cool again)",
    ),
    (
        "coordinator.ha",
        HaConfig(),
        "renew_interval_s",
        "lease_ttl_s",
        True,
        " (the lease would lapse between two renewals)",
    ),
    (
        "agent.heartbeat",
        HeartbeatConfig(),
        "check_interval_s",
        "timeout_s",
        True,
        " (a silent rank would be reported late)",
    ),
    (
        "agent.memory",
        MemoryConfig(),
        "available_critical_pct",
        "available_warn_pct",
        True,
        " (critical is the lower level of available memory)",
    ),
    (
        "coordinator",
        CoordinatorConfig(),
        "save_step_lead_s",
        "save_deadline_s",
        True,
        " (a save would wait out its deadline for the step it asks for)",
    ),
)


def _orderings(data: Mapping[Any, Any]) -> Iterator[Problem | None]:
    for prefix, defaults, low, high, strict, why in _ORDERS:
        table = _table(data, *prefix.split("."))
        lower, higher = _value(table, prefix, low, defaults), _value(table, prefix, high, defaults)
        yield _order(lower, higher, strict=strict, why=why)
    fs = _table(data, "agent", "fs")
    hysteresis = _value(fs, "agent.fs", "hysteresis_pct", FsConfig())
    mounts = fs.get("mounts")
    for i, mount in enumerate(mounts if isinstance(mounts, list) else []):
        if not isinstance(mount, dict):
            continue
        where, defaults = f"agent.fs.mounts[{i}]", FsMount(path="/")
        warn = _value(mount, where, "warn_pct", defaults)
        yield _order(warn, _value(mount, where, "critical_pct", defaults), strict=True)
        yield _order(hysteresis, warn, strict=True, why=" (a warning would never clear)")


def _windows(data: Mapping[Any, Any]) -> Iterator[Problem | None]:
    fs, prefix = _table(data, "agent", "fs"), "agent.fs"
    window = _value(fs, prefix, "forecast_window_s", FsConfig())
    # ftd.agent.watchers.fs fits a fill rate on forecast_min_samples samples spanning forecast_min_span_s
    too_few = _must_span(
        window,
        _value(fs, prefix, "forecast_min_samples", FsConfig()),
        _value(fs, prefix, "interval_s", FsConfig()),
        "no time-to-full forecast could be made",
    )
    yield too_few
    yield (
        None
        if too_few
        else _order(
            _value(fs, prefix, "forecast_min_span_s", FsConfig()),
            window,
            strict=False,
            why=" (no time-to-full forecast could be made)",
        )
    )
    memory, prefix = _table(data, "agent", "memory"), "agent.memory"
    yield _must_span(
        _value(memory, prefix, "leak_window_s", MemoryConfig()),
        _value(memory, prefix, "leak_min_samples", MemoryConfig()),
        _value(memory, prefix, "interval_s", MemoryConfig()),
        "no leak could ever be detected",
    )


def _policy(data: Mapping[Any, Any]) -> Iterator[Problem | None]:
    policy = _table(data, "coordinator", "policy")
    limits = policy.get("rate_limits")
    first: dict[str, int] = {}
    for i, limit in enumerate(limits if isinstance(limits, list) else []):
        kind = limit.get("kind") if isinstance(limit, dict) else None
        if not isinstance(kind, str):
            continue
        if kind in first:
            yield Problem(
                f"coordinator.policy.rate_limits[{i}].kind",
                f"{kind!r} already has a limit (rate_limits[{first[kind]}]); one limit per kind applies",
            )
        else:
            first[kind] = i
    entries = _table(data, "coordinator").get("node_labels")
    labelled = {
        key
        for entry in (entries if isinstance(entries, list) else [])
        if isinstance(entry, dict)
        for key, value in entry.items()
        if key != "nodes" and value is not None
    }
    budgets = policy.get("domain_budgets")
    for i, budget in enumerate(budgets if isinstance(budgets, list) else []):
        label = budget.get("label") if isinstance(budget, dict) else None
        if label in NODE_LABELS and label not in labelled:  # another label is a type error
            yield Problem(
                f"coordinator.policy.domain_budgets[{i}].label",
                f"no coordinator.node_labels entry sets {label!r}, so this budget never applies",
            )
