"""Declarative rules in TOML, for operators who do not write Python.

A file of ``[[rule]]`` tables, a *rule pack* (``coordinator.rules_file`` names one or more)::

    [[rule]]
    name = "dbe-twice"                      # required; plugin name "toml:dbe-twice"
    match = { kind = "xid", "data.code" = 48, severity = ">=error" }
    count = 2                               # how many matching events ... (default 1)
    window_s = 3600                         # ... within this many seconds (required if count > 1)
    per = "node"                            # count separately per "node" (default), "gpu" or "job"
    action = "drain_node"                   # an ActionKind value
    params = { ticket = true }              # extra action params (optional)
    reason = "{count} DBEs in {window_s}s on {node}"   # optional; placeholders below
    target = "node"                         # optional: "node" or "job"; default from the action

``match`` keys: ``kind``, ``node``, ``source``, ``severity`` and ``data.<key>[.<key>...]``. A value
matches by equality; a list matches any of its items; a string starting with ``>=``, ``<=``, ``>``,
``<`` or ``!=`` compares (numbers, or severities by rank: ``">=error"``); a string starting with
``~`` is a regular expression searched in the field's text. A missing field never matches.

Counting: each matching event adds its ``count`` (storm control's collapsed count) to the window of
its key (node name; GPU ``data.uuid`` or ``data.pci``; for ``per = "job"`` ``data.job`` or every job
on the node). When the sum within ``window_s`` reaches ``count``, the rule fires once and that window
starts afresh. Time is the events' own ``ts``, never a clock, so a replay (``ftd rules test``)
decides exactly as the live coordinator did.

State: the sliding windows live inside the rule object — allowed by the hook contract because
``ftd_evaluate`` stays a pure function of the events seen so far (no I/O, no clock). They are not
persisted: after a coordinator restart the windows start empty. Memory is bounded by the number of
keys with events inside their window (older entries are pruned on every event).

Targets: job actions (``checkpoint_restart``, ``checkpoint``) go to every job concerned (the event's
``data.job`` or the jobs on the node; ``params.exclude = [node]`` when ``exclude_node = true``); node
actions go to the event's node, with ``pci``/``uuid`` of the event added to the params.

Reason placeholders: ``{rule} {node} {kind} {severity} {count} {window_s}`` and any top-level
``data`` key (``{code}``, ``{pci}``); an unknown placeholder is left as written.

Every validation problem names the rule (index and name) and the field: :class:`DeclarativeError`.

Packs: ``coordinator.rules_file`` is one path or a list of paths; a path that is a directory stands
for every ``*.toml`` pack in it, sorted by name (names starting with ``_`` or ``.`` skipped), so the
packs of ``rules/`` are used side by side instead of concatenated (:func:`pack_files`,
:func:`load_rule_packs`). Rule names are unique across all the packs loaded together: a name declared
twice is an error naming both files (:func:`duplicate_problems`).
"""

from __future__ import annotations

import operator
import re
import tomllib
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ftd.events import Event, Kind, Severity
from ftd.plugin.actions import ActionKind, ActionRequest
from ftd.plugin.hookspecs import hookimpl
from ftd.plugin.view import ClusterView

PERS = ("node", "gpu", "job")
TARGETS = ("node", "job")
_RULE_KEYS = frozenset(
    {"name", "match", "count", "window_s", "per", "action", "params", "reason", "target", "exclude_node"}
)
_TOP_FIELDS = ("kind", "node", "source", "severity")
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")


class DeclarativeError(ValueError):
    """A rules file that cannot be used; ``problems`` lists every problem (rule and field named)."""

    def __init__(self, problems: list[str], source: str = "<rules>") -> None:
        self.problems = problems
        self.source = source
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


_MISSING = object()
Matcher = Callable[[Any], bool]


def _lookup(event: Event, path: str) -> Any:
    if path in _TOP_FIELDS:
        return getattr(event, path)
    value: Any = event.data
    for part in path.split(".")[1:]:
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _compile_value(field: str, spec: Any, where: str, problems: list[str]) -> Matcher | None:
    if isinstance(spec, list):
        subs = [_compile_value(field, item, where, problems) for item in spec]
        if not spec:
            problems.append(f"{where}: match.{field}: an empty list matches nothing")
        if any(s is None for s in subs):
            return None
        matchers = [s for s in subs if s is not None]
        return lambda v: any(m(v) for m in matchers)
    if isinstance(spec, dict):
        problems.append(
            f"{where}: match.{field}: expected a value, a list or an operator string, not a table"
        )
        return None
    if isinstance(spec, str) and spec.startswith("~"):
        try:
            pattern = re.compile(spec[1:])
        except re.error as exc:
            problems.append(f"{where}: match.{field}: bad regular expression: {exc}")
            return None
        return lambda v: v is not _MISSING and v is not None and pattern.search(str(v)) is not None
    if isinstance(spec, str):
        for op_text in _OPS:
            if spec.startswith(op_text):
                operand = spec[len(op_text) :].strip()
                return _compile_compare(field, op_text, operand, where, problems)
    if field == "kind" and spec not in set(Kind):
        problems.append(f"{where}: match.kind: unknown event kind {spec!r}")
        return None
    if field == "severity" and spec not in set(Severity):
        problems.append(f"{where}: match.severity: unknown severity {spec!r}")
        return None
    return _equals(spec)


def _equals(spec: Any) -> Matcher:
    def match(value: Any) -> bool:
        if value is _MISSING:
            return False
        if isinstance(spec, bool) or isinstance(value, bool):  # true must not equal 1
            return isinstance(value, bool) and isinstance(spec, bool) and value == spec
        return bool(value == spec)

    return match


def _compile_compare(
    field: str, op_text: str, operand: str, where: str, problems: list[str]
) -> Matcher | None:
    compare = _OPS[op_text]
    if field == "severity":
        if operand not in set(Severity):
            problems.append(f"{where}: match.severity: unknown severity {operand!r} in {op_text}{operand!r}")
            return None
        bound = Severity(operand).rank
        return lambda v: isinstance(v, Severity) and compare(v.rank, bound)
    try:
        number = float(operand)
    except ValueError:
        if op_text == "!=":
            return lambda v: v is not _MISSING and str(v) != operand
        problems.append(f"{where}: match.{field}: {op_text} needs a number, got {operand!r}")
        return None
    return lambda v: isinstance(v, int | float) and not isinstance(v, bool) and compare(float(v), number)


class DeclarativeRule:
    """One ``[[rule]]``: a plugin object whose ``ftd_evaluate`` counts matches in sliding windows."""

    def __init__(
        self,
        *,
        name: str,
        matchers: dict[str, Matcher],
        count: int,
        window_s: float,
        per: str,
        action: str,
        params: dict[str, Any],
        reason: str,
        target: str,
        exclude_node: bool,
        source: str = "<rules>",
    ) -> None:
        self.name = name
        self.source = source  # the pack (file) that declares it
        self.plugin_name = f"toml:{name}"
        self.matchers = matchers
        self.count = count
        self.window_s = window_s
        self.per = per
        self.action = action
        self.params = params
        self.reason = reason
        self.target = target
        self.exclude_node = exclude_node
        self._windows: dict[str, deque[tuple[float, int]]] = {}

    def matches(self, event: Event) -> bool:
        return all(m(_lookup(event, field)) for field, m in self.matchers.items())

    def _keys(self, event: Event, view: ClusterView) -> list[str]:
        if self.per == "node":
            return [event.node]
        if self.per == "gpu":
            gpu = event.data.get("uuid") or event.data.get("pci")
            return [f"{event.node}/{gpu}"] if gpu else []
        job = event.data.get("job")
        return [str(job)] if job not in (None, "") else view.jobs_on_node(event.node)

    def _tally(self, key: str, ts: float, n: int) -> int | None:
        """Add ``n`` at ``ts``; the sum in the window once it reaches ``count`` (then reset), else None."""
        window = self._windows.setdefault(key, deque())
        window.append((ts, n))
        while window and window[0][0] <= ts - self.window_s and self.count > 1:
            window.popleft()
        total = sum(k for _, k in window)
        if total >= self.count:
            del self._windows[key]
            return total
        return None

    def _prune(self, now: float) -> None:
        for key in [k for k, w in self._windows.items() if w and w[-1][0] <= now - self.window_s]:
            del self._windows[key]

    @hookimpl
    def ftd_evaluate(self, event: Event, view: ClusterView) -> list[ActionRequest] | None:
        if not self.matches(event):
            return None
        self._prune(event.ts)
        out: list[ActionRequest] = []
        for key in self._keys(event, view):
            total = self._tally(key, event.ts, max(1, event.count))
            if total is not None:
                out.extend(self._requests(event, view, key, total))
        return out or None

    def _requests(self, event: Event, view: ClusterView, key: str, total: int) -> list[ActionRequest]:
        fields: dict[str, Any] = {k: v for k, v in event.data.items() if isinstance(k, str)}
        fields.update(
            rule=self.name,
            node=event.node,
            kind=str(event.kind),
            severity=str(event.severity),
            count=total,
            window_s=f"{self.window_s:g}",
        )
        reason = (
            self.reason.format_map(_Keep(fields))
            if self.reason
            else (
                f"{self.name}: {total} x {event.kind} on {key}"
                + (f" within {self.window_s:g}s" if self.count > 1 else "")
            )
        )
        params: dict[str, Any] = {**self.params, "node": event.node, "matched": total}
        if self.target == "job":
            jobs = [key] if self.per == "job" else _jobs(event, view)
            if self.exclude_node:
                params["exclude"] = [event.node]
            return [ActionRequest(kind=self.action, target=job, reason=reason, params=params) for job in jobs]
        for gpu_key in ("pci", "uuid"):
            if event.data.get(gpu_key) is not None:
                params.setdefault(gpu_key, event.data[gpu_key])
        return [ActionRequest(kind=self.action, target=event.node, reason=reason, params=params)]


def _jobs(event: Event, view: ClusterView) -> list[str]:
    job = event.data.get("job")
    return [str(job)] if job not in (None, "") else view.jobs_on_node(event.node)


class _Keep(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def parse_rules(data: Any, source: str = "<rules>") -> list[DeclarativeRule]:
    """Validate parsed TOML data; :class:`DeclarativeError` listing every problem."""
    problems: list[str] = []
    if not isinstance(data, dict):
        raise DeclarativeError(["expected a table with [[rule]] entries"], source)
    unknown = sorted(set(data) - {"rule"})
    if unknown:
        problems.append(f"unknown top-level key(s) {', '.join(unknown)} (only [[rule]] tables)")
    entries = data.get("rule", [])
    if not isinstance(entries, list):
        raise DeclarativeError([*problems, "rule: must be an array of tables ([[rule]])"], source)
    rules: list[DeclarativeRule] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        rule = _parse_rule(index, entry, seen, problems, source)
        if rule is not None:
            rules.append(rule)
    if problems:
        raise DeclarativeError(problems, source)
    return rules


def _parse_rule(
    index: int, entry: Any, seen: set[str], problems: list[str], source: str
) -> DeclarativeRule | None:
    if not isinstance(entry, dict):
        problems.append(f"rule[{index}]: must be a table")
        return None
    name = entry.get("name")
    where = f"rule[{index}] {name!r}" if isinstance(name, str) else f"rule[{index}]"
    before = len(problems)

    def bad(field: str, message: str) -> None:
        problems.append(f"{where}: {field}: {message}")

    for key in sorted(set(entry) - _RULE_KEYS):
        bad(key, f"unknown field (known: {', '.join(sorted(_RULE_KEYS))})")
    if not isinstance(name, str) or not _NAME.match(name):
        bad("name", "required: letters, digits, '.', '_' and '-'")
    elif name in seen:
        bad("name", "another rule has the same name")
    else:
        seen.add(name)
    match = entry.get("match")
    matchers: dict[str, Matcher] = {}
    if not isinstance(match, dict) or not match:
        bad("match", "required: a table of field = value (at least kind)")
    else:
        for field, spec in match.items():
            if field not in _TOP_FIELDS and not (field.startswith("data.") and len(field) > 5):
                bad(f"match.{field}", f"unknown field (use {', '.join(_TOP_FIELDS)} or data.<key>)")
                continue
            matcher = _compile_value(field, spec, where, problems)
            if matcher is not None:
                matchers[field] = matcher
    count = entry.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        bad("count", f"must be an integer >= 1, got {count!r}")
        count = 1
    window_s = entry.get("window_s")
    if window_s is None:
        if count > 1:
            bad("window_s", "required when count > 1")
        window_s = 0.0
    elif isinstance(window_s, bool) or not isinstance(window_s, int | float) or window_s <= 0:
        bad("window_s", f"must be a number of seconds > 0, got {window_s!r}")
        window_s = 0.0
    per = entry.get("per", "node")
    if per not in PERS:
        bad("per", f"must be one of {', '.join(PERS)}, got {per!r}")
    action = entry.get("action")
    if action not in set(ActionKind):
        bad("action", f"must be one of {', '.join(ActionKind)}, got {action!r}")
    params = entry.get("params", {})
    if not isinstance(params, dict):
        bad("params", "must be a table")
        params = {}
    reason = entry.get("reason", "")
    if not isinstance(reason, str):
        bad("reason", "must be a string")
        reason = ""
    target = entry.get(
        "target", "job" if isinstance(action, str) and ActionKind.kind_targets_job(action) else "node"
    )
    if target not in TARGETS:
        bad("target", f"must be one of {', '.join(TARGETS)}, got {target!r}")
    if per == "job" and target == "node" and "target" in entry:
        pass  # counted per job, acted on the node: allowed
    exclude_node = entry.get("exclude_node", False)
    if not isinstance(exclude_node, bool):
        bad("exclude_node", "must be true or false")
    if len(problems) > before:
        return None
    return DeclarativeRule(
        name=str(name),
        matchers=matchers,
        count=count,
        window_s=float(window_s),
        per=str(per),
        action=str(action),
        params=dict(params),
        reason=reason,
        target=str(target),
        exclude_node=bool(exclude_node),
        source=source,
    )


def load_rules_file(path: str | Path) -> list[DeclarativeRule]:
    """Read and validate a rules file; :class:`DeclarativeError` (file, rule, field) if it is wrong."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DeclarativeError([f"cannot read rules file: {exc}"], source) from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DeclarativeError([f"invalid TOML: {exc}"], source) from exc
    return parse_rules(data, source)


#: What ``coordinator.rules_file`` holds: one path (a pack or a directory of packs) or a list of them.
RulesFileSpec = str | Path | Sequence[str | Path]


def rules_file_entries(spec: RulesFileSpec | None) -> list[str | Path]:
    """The paths ``coordinator.rules_file`` names, in order (a single path is a list of one)."""
    if spec is None:
        return []
    if isinstance(spec, str | Path):
        return [spec]
    return list(spec)


def pack_files(entry: str | Path) -> list[Path]:
    """The packs one ``rules_file`` entry stands for: a directory's ``*.toml`` files sorted by name
    (``_``/``.`` names skipped), otherwise the path itself (read later, so a missing file is reported
    by :func:`load_rules_file` with its path)."""
    path = Path(entry)
    if path.is_dir():
        return [p for p in sorted(path.glob("*.toml")) if not p.name.startswith(("_", "."))]
    return [path]


def duplicate_problems(rules: Sequence[DeclarativeRule]) -> list[str]:
    """One line per rule name declared in two packs, naming both files; one per pack loaded twice."""
    first: dict[str, DeclarativeRule] = {}
    problems: list[str] = []
    for rule in rules:
        earlier = first.setdefault(rule.name, rule)
        if earlier is rule:
            continue
        if earlier.source == rule.source:  # one pack loaded twice: say so once, not once per rule
            twice = (
                f"the pack {rule.source} is loaded twice (named twice in coordinator.rules_file, "
                "or as a file and through its directory)"
            )
            if twice not in problems:
                problems.append(twice)
        else:
            problems.append(
                f"rule {rule.name!r} is declared in {earlier.source} and again in {rule.source}: "
                "rule names must be unique across the packs of coordinator.rules_file"
            )
    return problems


def load_rule_packs(spec: RulesFileSpec | None) -> list[DeclarativeRule]:
    """Every rule of every pack ``spec`` names, in order; :class:`DeclarativeError` listing the
    problems of every broken pack (each line names its file) and every duplicate rule name."""
    rules: list[DeclarativeRule] = []
    problems: list[str] = []
    for entry in rules_file_entries(spec):
        for pack in pack_files(entry):
            try:
                rules.extend(load_rules_file(pack))
            except DeclarativeError as exc:
                problems.extend(f"{exc.source}: {problem}" for problem in exc.problems)
    if not problems:
        problems = duplicate_problems(rules)
    if problems:
        raise DeclarativeError(problems, "coordinator.rules_file")
    return rules
