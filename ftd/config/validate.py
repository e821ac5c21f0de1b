"""TOML -> typed :class:`~ftd.config.schema.Config`, or every problem in the file at once.

What: :func:`load_config` (a file), :func:`parse_config` (TOML text), :func:`config_from_data`
(parsed data) and :func:`validate_data` (the problems only). Unknown keys are errors; each problem
carries its dotted path (``coordinator.policy.cooldown_s``) and, for an unknown key, a suggestion
("did you mean ...", "it belongs in [bus]").

Why this shape: a daemon that refuses to start on a typo costs one restart; one that starts with a
misspelt key silently ignored (say ``cooldwon_s``) costs a drained cluster. So unknown keys are
errors, and an operator fixing a file should see *all* its mistakes in one run, each with its
dotted path, rather than one per restart. msgspec stops at the first error, so a generic validator
first walks the raw TOML data against the structs' own type information
(:func:`msgspec.inspect.type_info`: types, ``msgspec.Meta`` bounds, and ``Meta(extra=...)`` for
choices/hints) and collects every problem; only clean data is then built with
:func:`msgspec.convert`. New fields and sections are therefore validated automatically.

Rules between options that types cannot express (password vs password_file, ``warn_pct <
critical_pct``, ...) live in :mod:`ftd.config.relations`. :func:`valid_part` builds what can be
built from a file with problems, so the files it names can still be checked in the same run
(:mod:`ftd.commands.config_check`).
"""

from __future__ import annotations

import difflib
import math
import operator
import re
import tomllib
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi

from ftd.config.errors import ConfigError, Problem
from ftd.config.introspect import config_info, join, leaf_fields, type_name, unwrap
from ftd.config.relations import check_relations
from ftd.config.schema import Config

__all__ = [
    "config_from_data",
    "load_config",
    "load_config_data",
    "parse_config",
    "valid_part",
    "validate_data",
]


def load_config(path: str | Path) -> Config:
    """Read and validate the TOML file at ``path``. Raises :class:`ConfigError` listing every problem."""
    return config_from_data(load_config_data(path), source=str(path))


def load_config_data(path: str | Path) -> dict[str, Any]:
    """The TOML file at ``path``, parsed but not validated. Raises :class:`ConfigError` when it cannot
    be read, is not UTF-8 or is not TOML (with the line and column)."""
    source = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError([Problem("", f"cannot read config file: {reason}")], source) from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError([Problem("", "not valid UTF-8", line, column)], source) from exc
    return _parse_toml(text, source)


_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


def parse_config(text: str, *, source: str = "<string>") -> Config:
    """Parse and validate TOML text. ``source`` names it in error messages."""
    return config_from_data(_parse_toml(text, source), source=source)


def _parse_toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        line = column = None
        if match := _TOML_POSITION.search(message):
            line, column = int(match[1]), int(match[2])
            message = message[: match.start()]
        raise ConfigError([Problem("", f"invalid TOML: {message}", line, column)], source) from exc


def config_from_data(data: object, *, source: str = "<data>") -> Config:
    """Validate already-parsed data (what :func:`tomllib.loads` returns) and build the :class:`Config`."""
    problems = validate_data(data)
    if problems:
        raise ConfigError(problems, source)
    try:
        return msgspec.convert(data, Config)
    except msgspec.ValidationError as exc:  # the validator should have caught it; never leak msgspec's type
        text = str(exc)
        path = ""
        if " - at `$" in text:
            text, _, where = text.partition(" - at `$")
            path = where.rstrip("`").lstrip(".")
        raise ConfigError([Problem(path, text)], source) from exc


def validate_data(data: object) -> list[Problem]:
    """Every problem in ``data`` (parsed TOML) against :class:`Config`, in file order; ``[]`` if none."""
    problems: list[Problem] = []
    _check(data, config_info(), "", problems)
    if isinstance(data, dict):
        # A rule between options says nothing new about an option already wrong on its own.
        wrong = {problem.path for problem in problems}
        problems.extend(p for p in check_relations(data) if p.path not in wrong)
    return problems


def valid_part(data: object) -> tuple[Config | None, list[str]]:
    """The :class:`Config` built from the options of ``data`` that are valid on their own, the others
    left at their defaults, and the dotted paths of the options left out (an array with one bad entry
    is left out whole, so the indexes of problems found later still match the file). ``None`` when
    even that cannot be built. Rules between options are not applied: a value that breaks one is kept.
    """
    left_out: list[str] = []
    kept = _keep_valid(data, config_info(), "", left_out) if isinstance(data, dict) else {}
    try:
        return msgspec.convert(kept, Config), left_out
    except msgspec.ValidationError:
        return None, left_out


# --------------------------------------------------------------------------------------------------
# Generic validator over msgspec.inspect types


@cache
def _leaf_index() -> dict[str, list[str]]:
    """Option name -> every dotted path it exists at (to say "it belongs in [bus]")."""
    index: dict[str, list[str]] = {}
    for path, _ in leaf_fields():
        index.setdefault(path.rsplit(".", 1)[-1], []).append(path)
    return index


def _show(value: object, limit: int = 40) -> str:
    """``str 'abc'``, ``int 5``, ``bool true``, ``table`` ... for "expected X, got Y"."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"bool {str(value).lower()}"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return f"array of {len(value)}" if value else "empty array"
    text = repr(value) if isinstance(value, str) else str(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(value).__name__} {text}"


def _is_type_mismatch(problem: Problem, path: str) -> bool:
    """Whether ``problem`` says the value at ``path`` itself has the wrong type."""
    return problem.path == path and problem.message.startswith("expected ")


def _check(value: object, t: mi.Type, path: str, problems: list[Problem]) -> None:
    t, extra = unwrap(t)
    hint = f" ({extra['hint']})" if "hint" in extra else ""

    def fail(message: str) -> None:
        problems.append(Problem(path, message))

    def wrong_type() -> None:
        fail(f"expected {type_name(t)}, got {_show(value)}")

    if isinstance(t, mi.UnionType):
        members = [m for m in t.types if not isinstance(m, mi.NoneType)]
        if value is None and len(members) < len(t.types):
            return
        if len(members) == 1:
            _check(value, members[0], path, problems)
            return
        trials: list[list[Problem]] = []
        for member in members:
            trial: list[Problem] = []
            _check(value, member, path, trial)
            if not trial:
                return
            trials.append(trial)
        # One member has the value's shape (``rules_file = ["a", 1]`` is an array): its own problems
        # (``rules_file[1]: expected str``) say more than "expected str or array of str".
        shaped = [trial for trial in trials if not any(_is_type_mismatch(p, path) for p in trial)]
        if len(shaped) == 1:
            problems.extend(shaped[0])
            return
        wrong_type()
        return
    if isinstance(t, mi.StructType):
        _check_table(value, t, path, problems)
        return
    if isinstance(t, mi.BoolType):
        if not isinstance(value, bool):
            wrong_type()
            return
    elif isinstance(t, mi.IntType | mi.FloatType):
        allowed: tuple[type, ...] = (int,) if isinstance(t, mi.IntType) else (int, float)
        if isinstance(value, bool) or not isinstance(value, allowed):
            wrong_type()
            return
        assert isinstance(value, int | float)
        if isinstance(value, float) and not math.isfinite(value):
            fail(f"must be a finite number, got {value}")
            return
        if message := _range_problem(value, t):
            fail(message + hint)
            return
    elif isinstance(t, mi.StrType):
        if not isinstance(value, str):
            wrong_type()
            return
        if t.min_length is not None and len(value) < t.min_length:
            fail(
                ("must not be empty" if t.min_length == 1 else f"must be at least {t.min_length} characters")
                + hint
            )
            return
        if t.max_length is not None and len(value) > t.max_length:
            fail(f"must be at most {t.max_length} characters, got {len(value)}{hint}")
            return
        if t.pattern is not None and not re.search(t.pattern, value):
            fail(f"invalid value {value!r}" + (hint or f" (must match {t.pattern!r})"))
            return
    elif isinstance(t, mi.ListType):
        if not isinstance(value, list):
            wrong_type()
            return
        if t.min_length is not None and len(value) < t.min_length:
            fail(f"must have at least {t.min_length} items{hint}")
        if t.max_length is not None and len(value) > t.max_length:
            fail(f"must have at most {t.max_length} items{hint}")
        for i, item in enumerate(value):
            _check(item, t.item_type, f"{path}[{i}]", problems)
        return
    elif isinstance(t, mi.NoneType):
        if value is not None:
            wrong_type()
        return
    # Any other type: no structural check here; msgspec.convert reports it (see config_from_data).
    choices = extra.get("choices")
    if choices is not None and value not in choices:
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        suggestion = f" (did you mean {close[0]!r}?)" if close else ""
        listed = ", ".join(repr(c) for c in choices)
        fail(f"must be one of {listed}, got {value!r}{suggestion}")


def _range_problem(value: float, t: mi.IntType | mi.FloatType) -> str | None:
    bounds = [(op, b) for op, b in ((">=", t.ge), (">", t.gt), ("<=", t.le), ("<", t.lt)) if b is not None]
    if all(_COMPARE[op](value, bound) for op, bound in bounds):
        return None
    if t.ge is not None and t.le is not None and len(bounds) == 2:
        return f"must be between {t.ge} and {t.le}, got {value}"
    return f"must be {' and '.join(f'{op} {bound}' for op, bound in bounds)}, got {value}"


_COMPARE: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
}


def _check_table(value: object, st: mi.StructType, path: str, problems: list[Problem]) -> None:
    if not isinstance(value, dict):
        problems.append(Problem(path, f"expected table, got {_show(value)}"))
        return
    fields = {f.encode_name: f for f in st.fields}
    for key, item in value.items():
        field = fields.get(key) if isinstance(key, str) else None
        if field is None:
            problems.append(Problem(join(path, key), _unknown_key_message(str(key), item, path, fields)))
            continue
        _check(item, field.type, join(path, key), problems)
    for name, field in fields.items():
        if field.required and name not in value:
            problems.append(Problem(join(path, name), "required option is missing"))


def _keep_valid(
    table: Mapping[Any, Any], st: mi.StructType, path: str, left_out: list[str]
) -> dict[str, Any]:
    """``table`` without its unknown keys and invalid values (see :func:`valid_part`)."""
    fields = {f.encode_name: f for f in st.fields}
    kept: dict[str, Any] = {}
    for key, item in table.items():
        field = fields.get(key) if isinstance(key, str) else None
        if field is None:
            continue
        where = join(path, key)
        trial: list[Problem] = []
        _check(item, field.type, where, trial)
        inner, _ = unwrap(field.type)
        if not trial:
            kept[key] = item
        elif isinstance(inner, mi.StructType) and isinstance(item, dict):
            kept[key] = _keep_valid(item, inner, where, left_out)
        else:
            left_out.append(where)
    return kept


def _unknown_key_message(key: str, value: object, path: str, fields: Mapping[str, mi.Field]) -> str:
    kind = "section" if isinstance(value, dict) else "option"
    message = f"unknown {kind}"
    close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
    if not close:  # case typos ("Port") are common and scored low by difflib on short names
        close = [name for name in fields if name.lower() == key.lower()][:1]
    if close:
        return f"{message} (did you mean {join(path, close[0])!r}?)"
    elsewhere = [p for p in _leaf_index().get(key, []) if p.rsplit(".", 1)[0] != path]
    if elsewhere:
        return f"{message} (did you mean {elsewhere[0]!r}? it belongs in [{elsewhere[0].rsplit('.', 1)[0]}])"
    return f"{message}; known here: {', '.join(fields)}"
