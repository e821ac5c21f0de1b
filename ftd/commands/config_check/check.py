"""One check of a config file, the same for ``ftd check-config`` and for the daemons' start-up.

What: :func:`check_config_file` reads the file, validates it (types, bounds, unknown keys,
:mod:`relations <ftd.config.relations>` between options) and checks the files, directories and
rules it names (:mod:`.references`) for the daemons it serves; it returns the
:class:`Checked` config or raises one :class:`~ftd.config.errors.ConfigError` with every problem.

Why one function: the daemons refuse to start on exactly what ``check-config`` reports, so a file
that passes the check starts, and a daemon that does not start says why in the same words. Why
every problem at once, even with type errors in the file: the options that are valid are built
(:func:`~ftd.config.validate.valid_part`) and the files they name are checked in the same run;
only what depends on an invalid option is left for the next one.

Which daemons: ``roles`` when given (each daemon passes its own); otherwise the ones whose table
the file has (``[agent]``, ``[coordinator]``), or both when it has neither.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftd.commands.config_check.references import ROLES, check_references, deferred_credentials
from ftd.config.errors import ConfigError
from ftd.config.schema import Config
from ftd.config.validate import config_from_data, load_config_data, valid_part, validate_data

__all__ = ["Checked", "check_config_file", "roles_in"]


@dataclass(frozen=True)
class Checked:
    """A config that passed: the config, the daemons it was checked for, and the secret options not
    checked because only the service resolves their names (see :func:`deferred_credentials`)."""

    config: Config
    roles: tuple[str, ...]
    deferred: list[str] = field(default_factory=list)


def roles_in(data: Mapping[str, Any]) -> tuple[str, ...]:
    """The daemons whose table ``data`` has; both when it has neither (all defaults serve both)."""
    return tuple(role for role in ROLES if role in data) or ROLES


def check_config_file(
    path: str | Path,
    *,
    roles: Iterable[str] | None = None,
    files: bool = True,
    in_service: bool = True,
) -> Checked:
    """Validate the file at ``path`` and, with ``files``, what it names for ``roles``. Raises
    :class:`ConfigError` listing every problem. ``in_service=False`` (``ftd check-config``) leaves
    relative secret names to the service (:func:`~.references.deferred_credentials`)."""
    source = str(path)
    data = load_config_data(path)
    problems = validate_data(data)
    unknown: list[str] = []
    if problems:
        config, unknown = valid_part(data)
    else:
        config = config_from_data(data, source=source)
    chosen = tuple(roles) if roles is not None else roles_in(data)
    deferred: list[str] = []
    if files and config is not None:
        problems += check_references(config, roles=chosen, in_service=in_service, unknown=unknown)
        if not in_service:
            deferred = deferred_credentials(config, chosen)
    if problems or config is None:
        raise ConfigError(problems, source)
    return Checked(config, chosen, deferred)
