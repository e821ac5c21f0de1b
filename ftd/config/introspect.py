"""The schema as :mod:`msgspec.inspect` sees it: type information, dotted paths, type names, walks.

What: the few helpers both the validator (:mod:`ftd.config.validate`) and ``--explain``
(:mod:`ftd.config.explain`) need to read the structs of :mod:`ftd.config.schema` generically:
:func:`config_info` (the type tree of :class:`~ftd.config.schema.Config`), :func:`unwrap` (a type
without its ``Annotated`` metadata), :func:`join` (TOML-quoted dotted paths), :func:`type_name`
(``int``, ``array of str``, ...) and :func:`leaf_fields` (every option with its path).

Why one module: the validator's messages ("expected int", "it belongs in [bus]") and the explain
output name types and paths the same way; defining them once keeps the two in step.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

import msgspec.inspect as mi

from ftd.config.schema import Config

__all__ = ["config_info", "join", "leaf_fields", "type_name", "unwrap"]


@cache
def config_info() -> mi.StructType:
    """:class:`~ftd.config.schema.Config` as a :mod:`msgspec.inspect` type tree."""
    info = mi.type_info(Config)
    assert isinstance(info, mi.StructType)
    return info


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")


def join(path: str, key: object) -> str:
    """``path.key``, with ``key`` quoted as TOML quotes it when it is not a bare key."""
    text = key if isinstance(key, str) else str(key)
    if not _BARE_KEY.match(text):
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"{path}.{text}" if path else text


def unwrap(t: mi.Type) -> tuple[mi.Type, Mapping[str, Any]]:
    """The type under any ``Annotated`` metadata, and the metadata's merged ``extra``."""
    extra: dict[str, Any] = {}
    while isinstance(t, mi.Metadata):
        extra.update(t.extra or {})
        t = t.type
    return t, extra


def type_name(t: mi.Type) -> str:
    """The TOML name of a type, without bounds: ``int``, ``table``, ``array of str``, ``str or int``."""
    t, _ = unwrap(t)
    if isinstance(t, mi.BoolType):
        return "bool"
    if isinstance(t, mi.IntType):
        return "int"
    if isinstance(t, mi.FloatType):
        return "float"
    if isinstance(t, mi.StrType):
        return "str"
    if isinstance(t, mi.StructType):
        return "table"
    if isinstance(t, mi.ListType):
        return f"array of {type_name(t.item_type)}"
    if isinstance(t, mi.DictType):
        return f"table of {type_name(t.value_type)}"
    if isinstance(t, mi.UnionType):
        return " or ".join(type_name(m) for m in t.types if not isinstance(m, mi.NoneType))
    if isinstance(t, mi.NoneType):
        return "none"
    return type(t).__name__.removesuffix("Type").lower()


def leaf_fields(
    st: mi.StructType | None = None, prefix: str = "", *, nested: bool = False
) -> Iterator[tuple[str, mi.Field]]:
    """Every option under ``st`` (default: the whole :class:`~ftd.config.schema.Config`) with its
    dotted path, in declaration order. A sub-table is walked in place: its keys are listed, not the
    table itself.

    A table that is not a plain sub-table (an array of tables such as ``agent.fs.mounts``, a map of
    tables, an optional table) is one option; with ``nested``, the keys of its tables follow the
    fields of the table that holds it, as ``agent.fs.mounts[].path`` (one entry of an array) or
    ``section.map.<name>.key`` (any entry of a map)."""
    later: list[tuple[str, mi.StructType]] = []
    for field in (config_info() if st is None else st).fields:
        path = join(prefix, field.encode_name)
        inner, _ = unwrap(field.type)
        if isinstance(inner, mi.StructType):
            yield from leaf_fields(inner, path, nested=nested)
            continue
        yield path, field
        if nested:
            later.extend((path + suffix, table) for suffix, table in _tables_in(inner))
    for path, table in later:
        yield from leaf_fields(table, path, nested=nested)


def _tables_in(t: mi.Type) -> Iterator[tuple[str, mi.StructType]]:
    """The tables a value of type ``t`` may hold, each with the path suffix that reaches its keys."""
    t, _ = unwrap(t)
    if isinstance(t, mi.StructType):
        yield "", t
    elif isinstance(t, mi.ListType):
        yield from ((f"[]{suffix}", table) for suffix, table in _tables_in(t.item_type))
    elif isinstance(t, mi.DictType):
        yield from ((f".<name>{suffix}", table) for suffix, table in _tables_in(t.value_type))
    elif isinstance(t, mi.UnionType):
        for member in t.types:
            yield from _tables_in(member)
