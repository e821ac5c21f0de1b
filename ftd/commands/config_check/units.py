"""The systemd credentials a config's relative secret names need, checked against the installed unit.

What: a relative secret name (``password_file = "broker-password"``) is a systemd credential: the
daemon reads it from ``$CREDENTIALS_DIRECTORY``, which the unit's ``LoadCredential=NAME:SOURCE``
fills. Outside the service (``ftd check-config`` run by an operator) that directory does not exist,
but the installed unit does: :func:`unit_credential_problems` reads ``ftd-<daemon>.service`` and its
drop-ins (``ftd-<daemon>.service.d/*.conf``) in :data:`UNIT_DIRS` and reports, at the option, a name
the unit does not load (the daemon would not find its secret) and a ``SOURCE`` that cannot be read
(systemd refuses to start the unit: ``status=243/CREDENTIALS``). :func:`credentials_of` is the
parser. No unit installed: nothing to say (the name stays "not checked").

Why: a unit that loads ``broker-password`` while the config names ``mqtt-password``, or a credential
whose file was never put in place, stops the daemon before it logs a line; ``check-config`` should
say so first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from ftd.config import paths
from ftd.config.errors import Problem

__all__ = ["UNIT_DIRS", "credentials_of", "unit_credential_problems"]

#: Where an installed unit is looked for, first match wins (an administrator's unit, then a package's).
UNIT_DIRS: Sequence[Path] = (Path("/etc/systemd/system"), Path("/lib/systemd/system"))

_LOAD = re.compile(r"^\s*LoadCredential\s*=\s*(.*)$")


def credentials_of(texts: Iterable[str]) -> dict[str, str]:
    """``{name: source}`` of the ``LoadCredential=`` lines in unit file ``texts`` (later ones win; an
    empty ``LoadCredential=`` resets the list, as systemd does)."""
    found: dict[str, str] = {}
    for text in texts:
        for line in text.splitlines():
            match = _LOAD.match(line)
            if match is None:
                continue
            value = match.group(1).strip()
            if not value:
                found.clear()
                continue
            name, _, source = value.partition(":")
            found[name.strip()] = source.strip() or name.strip()
    return found


def _unit_texts(role: str, dirs: Sequence[Path]) -> tuple[Path, list[str]] | None:
    """The first installed ``ftd-<role>.service`` in ``dirs`` with its drop-ins' texts, or None."""
    name = f"ftd-{role}.service"
    for directory in dirs:
        unit = directory / name
        if unit.is_file():
            drop_ins = sorted((directory / f"{name}.d").glob("*.conf"))
            return unit, [path.read_text(errors="replace") for path in (unit, *drop_ins)]
    return None


def unit_credential_problems(
    secrets: Iterable[tuple[str, str]], roles: Iterable[str], dirs: Sequence[Path] | None = None
) -> list[Problem]:
    """Problems with the relative ``(option, name)`` ``secrets`` against the installed unit of each
    daemon in ``roles`` (see the module docstring)."""
    problems: list[Problem] = []
    wanted = list(secrets)
    for role in roles:
        installed = _unit_texts(role, UNIT_DIRS if dirs is None else dirs)
        if installed is None:
            continue
        unit, texts = installed
        loaded = credentials_of(texts)
        for option, name in wanted:
            if role == "agent" and not option.startswith("bus."):
                continue
            source = loaded.get(name)
            if source is None:
                reason = (
                    f"{name!r} is a systemd credential, but {unit} loads none by that name "
                    f"(add LoadCredential={name}:/etc/ftd/{name})"
                )
                problems.append(Problem(option, reason))
            elif source.startswith("/") and (problem := paths.file_problem(source)) is not None:
                reason = (
                    f"{problem} (the source of {unit}'s LoadCredential={name}: systemd would not start it)"
                )
                problems.append(Problem(option, reason))
    return problems
