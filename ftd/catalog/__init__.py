"""Xid knowledge as versioned data: ``xid.toml`` plus a small, validating loader.

The catalog says, for every NVIDIA Xid code, what it means and NVIDIA's *immediate action* bucket
(RESTART_APP, RESET_GPU, RESTART_BM, ...). It is data, not code, so an operator can read it, diff it
against NVIDIA's spreadsheet and bump ``version`` without touching the parser or the rules. Every
event the agent derives from a kernel line carries the bucket, and rules decide from it.

The file is read once (cached) through :mod:`importlib.resources`, so it works from a wheel too.
Every entry is validated at load time; an error names the code and the field.

Unknown codes: :meth:`XidCatalog.lookup` returns ``None``; :meth:`XidCatalog.get` returns a default
entry whose action is the catalog's ``unknown_action`` (``CONTACT_SUPPORT``: a code this ftd does not
know is unexpected, so a human should look, but it is not by itself a reason to drain a node) with
severity ``warning`` and ``fatal = false``.
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Mapping
from importlib import resources
from typing import Any

import msgspec

__all__ = [
    "ACTIONS",
    "SEVERITIES",
    "CatalogError",
    "XidCatalog",
    "XidInfo",
    "load_xid_catalog",
    "parse_xid_catalog",
]

#: Every immediate-action bucket the catalog may use (NVIDIA's names, plus UNKNOWN for safety).
ACTIONS = frozenset(
    {
        "RESTART_APP",
        "IGNORE",
        "RESET_GPU",
        "RESTART_BM",
        "RESTART_VM",
        "CONTACT_SUPPORT",
        "CHECK_MECHANICALS",
        "UPDATE_SWFW",
        "WORKFLOW_XID_45",
        "WORKFLOW_XID_48",
        "WORKFLOW_NVLINK_ERR",
        "WORKFLOW_NVLINK5_ERR",
        "XID_154",
        "XID_154_EVAL",
        "CHECK_UVM",
    }
)
SEVERITIES = ("info", "warning", "error", "critical")
_MAX_CODE = 10_000


class CatalogError(ValueError):
    """The catalog file is malformed; the message names the code and field."""


class XidInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One catalog entry: what an Xid code means and what to do about it."""

    code: int
    name: str
    description: str
    action: str
    fatal: bool
    severity: str
    follows: tuple[int, ...] = ()
    investigate: str = ""
    applies_to: tuple[str, ...] = ()
    notes: str = ""
    unused: bool = False  # NVIDIA lists the code as unused on current data-centre GPUs
    inferred: bool = False  # NVIDIA publishes no bucket; ftd chose ``action``
    known: bool = True  # False for the default entry returned for an unknown code


class XidCatalog(msgspec.Struct, frozen=True, kw_only=True):
    """The loaded catalog: entries by code, bucket meanings, version and source."""

    version: str
    source: str
    unknown_action: str
    entries: Mapping[int, XidInfo]
    actions: Mapping[str, str]

    def lookup(self, code: int) -> XidInfo | None:
        """The entry for ``code``, or ``None`` when the catalog does not list it."""
        return self.entries.get(code)

    def get(self, code: int) -> XidInfo:
        """The entry for ``code``, or a conservative default for an unknown code (see module doc)."""
        info = self.entries.get(code)
        if info is not None:
            return info
        return XidInfo(
            code=code,
            name="UNKNOWN_XID",
            description=f"Xid {code} is not in ftd's catalog (version {self.version}).",
            action=self.unknown_action,
            fatal=False,
            severity="warning",
            known=False,
        )

    def action_meaning(self, action: str) -> str:
        """What an immediate-action bucket asks an operator to do."""
        return self.actions.get(action, "")

    def __contains__(self, code: object) -> bool:
        return code in self.entries

    def __len__(self) -> int:
        return len(self.entries)


# --- validation -------------------------------------------------------------------------------


def _field(entry: Mapping[str, Any], where: str, key: str, type_: type, *, required: bool = True) -> Any:
    if key not in entry:
        if required:
            raise CatalogError(f"{where}: missing field {key!r}")
        return None
    value = entry[key]
    if not isinstance(value, type_) or (type_ is int and isinstance(value, bool)):
        raise CatalogError(f"{where}: field {key!r} must be {type_.__name__}, got {value!r}")
    return value


def _int_list(entry: Mapping[str, Any], where: str, key: str) -> tuple[int, ...]:
    values = _field(entry, where, key, list, required=False) or []
    for value in values:
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < _MAX_CODE:
            raise CatalogError(f"{where}: field {key!r} must list Xid codes, got {value!r}")
    return tuple(values)


def _str_list(entry: Mapping[str, Any], where: str, key: str) -> tuple[str, ...]:
    values = _field(entry, where, key, list, required=False) or []
    if not all(isinstance(value, str) for value in values):
        raise CatalogError(f"{where}: field {key!r} must be a list of strings")
    return tuple(values)


_KNOWN_KEYS = frozenset(
    {
        "name",
        "description",
        "action",
        "investigate",
        "fatal",
        "severity",
        "follows",
        "applies_to",
        "notes",
        "unused",
        "inferred",
    }
)


def _parse_entry(key: str, entry: Any) -> XidInfo:
    where = f"xid.{key}"
    if not key.isdecimal() or not 0 < int(key) < _MAX_CODE:
        raise CatalogError(f"{where}: the table name must be an Xid code (1..{_MAX_CODE - 1})")
    if not isinstance(entry, dict):
        raise CatalogError(f"{where}: must be a table")
    unknown = sorted(set(entry) - _KNOWN_KEYS)
    if unknown:
        raise CatalogError(f"{where}: unknown field(s) {', '.join(unknown)}")
    action = _field(entry, where, "action", str)
    if action not in ACTIONS:
        raise CatalogError(f"{where}: field 'action' has unknown bucket {action!r}")
    severity = _field(entry, where, "severity", str)
    if severity not in SEVERITIES:
        raise CatalogError(f"{where}: field 'severity' must be one of {', '.join(SEVERITIES)}")
    return XidInfo(
        code=int(key),
        name=_field(entry, where, "name", str),
        description=_field(entry, where, "description", str),
        action=action,
        fatal=_field(entry, where, "fatal", bool),
        severity=severity,
        follows=_int_list(entry, where, "follows"),
        investigate=_field(entry, where, "investigate", str, required=False) or "",
        applies_to=_str_list(entry, where, "applies_to"),
        notes=_field(entry, where, "notes", str, required=False) or "",
        unused=bool(_field(entry, where, "unused", bool, required=False)),
        inferred=bool(_field(entry, where, "inferred", bool, required=False)),
    )


def parse_xid_catalog(text: str) -> XidCatalog:
    """Parse and validate catalog TOML text (exposed for tests and for operator overrides)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"xid catalog is not valid TOML: {exc}") from None
    version = _field(doc, "catalog", "version", str)
    source = _field(doc, "catalog", "source", str)
    unknown_action = _field(doc, "catalog", "unknown_action", str, required=False) or "CONTACT_SUPPORT"
    if unknown_action not in ACTIONS:
        raise CatalogError(f"catalog: field 'unknown_action' has unknown bucket {unknown_action!r}")
    actions = _field(doc, "catalog", "actions", dict, required=False) or {}
    for bucket, meaning in actions.items():
        if bucket not in ACTIONS or not isinstance(meaning, str):
            raise CatalogError(f"actions.{bucket}: must be a known bucket with a text meaning")
    table = _field(doc, "catalog", "xid", dict)
    entries = {info.code: info for info in (_parse_entry(key, entry) for key, entry in table.items())}
    return XidCatalog(
        version=version,
        source=source,
        unknown_action=unknown_action,
        entries=dict(sorted(entries.items())),
        actions=dict(actions),
    )


@functools.cache
def load_xid_catalog() -> XidCatalog:
    """The packaged catalog (``ftd/catalog/xid.toml``), parsed once per process."""
    text = resources.files(__name__).joinpath("xid.toml").read_text(encoding="utf-8")
    return parse_xid_catalog(text)
