"""The log pattern table: which lines of a training log are events, as data (``log_patterns.toml``).

What: :func:`parse_patterns` turns a pattern table (TOML ``[[pattern]]`` entries: ``name``, ``regex``,
``severity``, optional ``kind``, ``ignore_case``, ``disposition``, ``needles`` and ``xid``) into compiled
:class:`LogPattern` rows, raising
``ValueError`` that names the entry for any bad field; :func:`load_patterns` reads the built-in table
shipped beside this module, or an operator's ``agent.logs.patterns_file``.

Why in the catalog: like the Xid catalog, the table is knowledge kept as versioned data, read by more
than one floor: the agent's log watcher (:mod:`ftd.agent.watchers.logfile`) matches lines with it, and
``ftd check-config`` loads an operator's file with this same loader so a table that would stop the
agent is reported before it starts. Keeping it here lets both import it without importing the agent.

``disposition`` (``restart`` | ``stop``; absent: the rules decide by the name) says what a failure with
that signature calls for: ``stop`` when the same program on the same input would fail the same way
again (a configuration or argument error, a missing file, a checkpoint that does not fit the model,
NaN/Inf loss, the scheduler's time limit), ``restart`` when a restart may well succeed (an NCCL
timeout, a CUDA launch failure). The coordinator's ``app_faults`` rule reads it through
:func:`dispositions` (an event's own ``data.disposition`` wins, for operators' tables).

``xid`` (a code the Xid catalog knows) says the line reports what that Xid reports: the trainer's
"uncorrectable ECC error encountered" is the kernel's Xid 48, "CUDA-capable device(s) is/are busy or
unavailable" its Xid 79. The log watcher puts it in the event (``data.xid``) and the ``xid_catalog``
rule decides the line by that Xid's plan (:func:`xid_counterparts` for the built-in table's names).
"""

from __future__ import annotations

import functools
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ftd.catalog import load_xid_catalog
from ftd.events import Kind, Severity

__all__ = [
    "DISPOSITIONS",
    "LogPattern",
    "dispositions",
    "load_patterns",
    "parse_patterns",
    "xid_counterparts",
]

_KEYS = frozenset({"name", "regex", "severity", "kind", "ignore_case", "disposition", "needles", "xid"})

#: What a pattern's ``disposition`` may say.
DISPOSITIONS = ("restart", "stop")


@dataclass(frozen=True, slots=True)
class LogPattern:
    """One row of the table: lines matching ``regex`` become a ``kind`` event at ``severity``."""

    name: str
    regex: re.Pattern[str]
    severity: Severity
    kind: Kind = Kind.LOG_PATTERN
    disposition: str | None = None
    #: Lower-case strings one of which every match contains (``needles`` in the table): a line
    #: without any is passed over without running the regex (substring tests are C-speed; a regex
    #: of several case-insensitive alternatives tried at every position of every line is not).
    needles: tuple[str, ...] = ()
    #: The Xid this line reports (the trainer's side of it): decided as that Xid (rule xid_catalog).
    xid: int | None = None

    def search(self, text: str, lowered: str | None = None) -> bool:
        """Whether ``text`` matches (``lowered``: ``text.lower()``, when the caller has it)."""
        needles = self.needles
        if needles:
            low = text.lower() if lowered is None else lowered
            for needle in needles:  # a plain loop: a generator costs more than the tests it makes
                if needle in low:
                    break
            else:
                return False
        return self.regex.search(text) is not None


def parse_patterns(text: str, source: str = "<patterns>") -> list[LogPattern]:
    """Parse a pattern table; raise ``ValueError`` naming the entry for any bad field."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{source}: invalid TOML: {exc}") from None
    entries = data.get("pattern")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{source}: no [[pattern]] entries")
    out: list[LogPattern] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"{source}: pattern[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: not a table")
        unknown = set(entry) - _KEYS
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
        name, regex = entry.get("name"), entry.get("regex")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: name must be a non-empty string")
        if name in seen:
            raise ValueError(f"{where}: duplicate name {name!r}")
        seen.add(name)
        if not isinstance(regex, str) or not regex:
            raise ValueError(f"{where} ({name}): regex must be a non-empty string")
        try:
            compiled = re.compile(regex, re.IGNORECASE if entry.get("ignore_case") else 0)
        except re.error as exc:
            raise ValueError(f"{where} ({name}): bad regex: {exc}") from None
        try:
            severity = Severity(entry.get("severity", "warning"))
            kind = Kind(entry.get("kind", "log_pattern"))
        except ValueError as exc:
            raise ValueError(f"{where} ({name}): {exc}") from None
        disposition = entry.get("disposition")
        if disposition is not None and disposition not in DISPOSITIONS:
            raise ValueError(f"{where} ({name}): disposition must be one of {', '.join(DISPOSITIONS)}")
        needles = entry.get("needles", [])
        if not isinstance(needles, list) or not all(
            isinstance(n, str) and n and n == n.lower() for n in needles
        ):
            raise ValueError(f"{where} ({name}): needles must be a list of non-empty lower-case strings")
        xid = entry.get("xid")
        if xid is not None and (
            not isinstance(xid, int) or isinstance(xid, bool) or load_xid_catalog().lookup(xid) is None
        ):
            raise ValueError(f"{where} ({name}): xid must be an Xid code the catalog knows, not {xid!r}")
        out.append(LogPattern(name, compiled, severity, kind, disposition, tuple(needles), xid))
    return out


def load_patterns(path: str | None = None) -> list[LogPattern]:
    """The built-in table, or the file at ``path``."""
    if path is not None:
        return parse_patterns(Path(path).read_text(encoding="utf-8"), path)
    text = resources.files("ftd.catalog").joinpath("log_patterns.toml").read_text(encoding="utf-8")
    return parse_patterns(text, "log_patterns.toml")


@functools.cache
def xid_counterparts() -> dict[str, int]:
    """The built-in table's ``xid`` by pattern name (patterns without one left out)."""
    return {p.name: p.xid for p in load_patterns() if p.xid is not None}


@functools.cache
def dispositions() -> dict[str, str]:
    """The built-in table's ``disposition`` by pattern name (patterns without one left out)."""
    return {p.name: p.disposition for p in load_patterns() if p.disposition is not None}
