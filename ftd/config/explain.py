"""What ``ftd check-config --explain`` prints: every option with its type, default and meaning.

What: :func:`describe_options` lists the options of :class:`~ftd.config.schema.Config` as
:class:`Option` rows (dotted path, type with bounds, default in TOML syntax, description);
``nested=True`` adds the keys of the tables inside arrays of tables (``[[agent.fs.mounts]]``,
listed as ``agent.fs.mounts[].path``) and maps. :func:`explain_text` renders them grouped by
TOML table, which is the ``--explain`` output.

Why derived, never written: the rows come from the structs themselves (their ``Annotated``
descriptions and bounds), so the explanation cannot drift from what the validator accepts, and a
new field is documented the moment it is declared.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec
import msgspec.inspect as mi

from ftd.config.introspect import leaf_fields, type_name, unwrap

__all__ = ["Option", "describe_options", "explain_text"]

_REQUIRED = "required"  # the default shown for an option that has none


class Option(NamedTuple):
    """One leaf option, for ``ftd check-config --explain``."""

    path: str
    type: str
    default: str
    doc: str


def describe_options(*, nested: bool = False) -> list[Option]:
    """Every leaf option of :class:`~ftd.config.schema.Config`: dotted path, type (with bounds),
    default (TOML syntax, ``unset``, or ``required``) and description, in declaration order. Derived
    from the structs themselves. An array of tables is one option; with ``nested``, the keys of its
    tables follow the table holding it (``agent.fs.mounts[].path``; see
    :func:`~ftd.config.introspect.leaf_fields`)."""
    return [_option(path, field) for path, field in leaf_fields(nested=nested)]


def _option(path: str, field: mi.Field) -> Option:
    if field.default is not msgspec.NODEFAULT:
        default: object = field.default
    elif field.default_factory is not msgspec.NODEFAULT:
        default = field.default_factory()
    else:
        default = msgspec.NODEFAULT
    return Option(path, _type_label(field.type), _toml_value(default), _description(field.type))


def explain_text() -> str:
    """Every option, nested tables' keys included, grouped by TOML table (``[agent.fs]``,
    ``[[agent.fs.mounts]]``), each with its type, default and description."""
    lines: list[str] = []
    section = None
    for option in describe_options(nested=True):
        current = option.path.rsplit(".", 1)[0]
        if current != section:
            if lines:
                lines.append("")
            lines.append(_header(current))
            section = current
        default = _REQUIRED if option.default == _REQUIRED else f"default {option.default}"
        lines.append(f"{option.path}: {option.type}, {default}")
        if option.doc:
            lines.append(f"    {option.doc}")
    return "\n".join(lines)


def _header(table: str) -> str:
    """The TOML header of a table's keys: ``[a.b]``, or ``[[a.b]]`` for the tables of an array."""
    if table.endswith("[]"):
        return f"[[{table.replace('[]', '')}]]"
    return f"[{table}]"


def _description(t: mi.Type) -> str:
    while isinstance(t, mi.Metadata):
        text = (t.extra_json_schema or {}).get("description")
        if text:
            return str(text)
        t = t.type
    return ""


def _type_label(t: mi.Type) -> str:
    t, extra = unwrap(t)
    if isinstance(t, mi.UnionType):
        members = [m for m in t.types if not isinstance(m, mi.NoneType)]
        return " or ".join(_type_label(m) for m in members)
    if isinstance(t, mi.ListType):
        return f"array of {_type_label(t.item_type)}"
    notes: list[str] = []
    if isinstance(t, mi.IntType | mi.FloatType):
        if t.ge is not None and t.le is not None:
            notes.append(f"{t.ge}..{t.le}")
        else:
            for op, bound in ((">=", t.ge), (">", t.gt), ("<=", t.le), ("<", t.lt)):
                if bound is not None:
                    notes.append(f"{op} {bound}")
    if isinstance(t, mi.StrType):
        if t.max_length is not None:
            notes.append(f"at most {t.max_length} chars")
        if t.pattern is not None:
            notes.append(str(extra.get("hint", f"matching {t.pattern}")))
    if "choices" in extra:
        notes.append("one of " + ", ".join(_toml_value(c) for c in extra["choices"]))
    base = type_name(t)
    return f"{base} ({'; '.join(notes)})" if notes else base


def _toml_value(value: object) -> str:
    if value is msgspec.NODEFAULT:
        return _REQUIRED
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return msgspec.json.encode(value).decode()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return str(value)
