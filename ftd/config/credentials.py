"""Secrets a config points at (the broker password, the API token, the webhook URL), read from files.

What: :func:`read_secret_file` reads one, resolving a relative path against
``$CREDENTIALS_DIRECTORY`` (systemd ``LoadCredential=``); :func:`resolve_password` gives the broker
password, inline or from ``bus.password_file``; :func:`standby_bus` the login of an HA standby's
read-only view (``coordinator.ha.standby_*``), or why it has none.

Why apart from validation: a secret is read when a daemon starts or a call needs it, not when the
file is checked (``ftd check-config`` runs outside the service's credential sandbox), and a rotated
secret is re-read without reloading the config.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from ftd.config.errors import ConfigError, Problem
from ftd.config.paths import os_reason
from ftd.config.schema import BusConfig, Config

__all__ = ["STANDBY_OPTIONS", "read_secret_file", "resolve_password", "standby_bus"]

#: The standby view's login options (``coordinator.ha.<key>``) and the ``bus`` option each replaces.
STANDBY_OPTIONS = {
    "standby_username": "username",
    "standby_password_file": "password_file",
    "standby_cert_file": "cert_file",
    "standby_key_file": "key_file",
}


def read_secret_file(name: str, key: str) -> str:
    """The contents of the secret file ``name`` given at config ``key``: a relative path is resolved
    against ``$CREDENTIALS_DIRECTORY`` when set (systemd ``LoadCredential=``), one trailing newline is
    removed. Raises :class:`ConfigError` (naming ``key``) when it is unreadable or empty."""
    path = Path(name).expanduser()
    creds = os.environ.get("CREDENTIALS_DIRECTORY")
    if not path.is_absolute() and creds:
        path = Path(creds) / path
    try:
        secret = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = os_reason(exc) if isinstance(exc, OSError) else str(exc)
        hint = ""
        if not Path(name).is_absolute() and not creds:
            hint = " ($CREDENTIALS_DIRECTORY is not set, so the path is relative to the working directory)"
        elif not Path(name).is_absolute() and isinstance(exc, FileNotFoundError):
            hint = f" (the unit loads no credential {name!r}: add LoadCredential={name}:/etc/ftd/{name})"
        raise ConfigError([Problem(key, f"cannot read {path}: {reason}{hint}")]) from exc
    if secret.endswith("\n"):
        secret = secret[:-1].removesuffix("\r")
    if not secret:
        raise ConfigError([Problem(key, f"{path} is empty")])
    return secret


def resolve_password(bus: BusConfig) -> str | None:
    """The broker password: ``bus.password``, or the contents of ``bus.password_file``
    (:func:`read_secret_file`); ``None`` when neither is set. Raises :class:`ConfigError`."""
    if bus.password is not None:
        return bus.password
    if bus.password_file is None:
        return None
    return read_secret_file(bus.password_file, "bus.password_file")


def standby_bus(config: Config) -> tuple[BusConfig | None, str | None]:
    """The bus an HA standby's read-only view (:class:`ftd.coordinator.ha.runner.RetainedView`) connects
    with, or ``(None, why not)``.

    ``bus`` with the ``coordinator.ha.standby_*`` login in place of the coordinator's, and never
    ``bus.client_id`` (the view gets a client id of its own). Without a standby login, only on an
    anonymous bus: the coordinator's own login would, under Mosquitto's ``use_username_as_clientid``
    (deploy/mosquitto), make the view *the* ``coordinator`` client and the broker would close the
    leader's persistent session to let it in. (An anonymous bus has no user name to take a client id
    from, and the view never uses ``bus.client_id``: no collision there.)"""
    bus, ha = config.bus, config.coordinator.ha
    if any(getattr(ha, option) is not None for option in STANDBY_OPTIONS):
        login = {field: getattr(ha, option) for option, field in STANDBY_OPTIONS.items()}
        return msgspec.structs.replace(bus, password=None, client_id=None, **login), None
    what = (
        "set coordinator.ha.standby_username and standby_password_file "
        "(or standby_cert_file and standby_key_file)"
    )
    if bus.username is not None or bus.cert_file is not None:
        return None, f"the bus is authenticated and the view would log in as the coordinator; {what}"
    return msgspec.structs.replace(bus, client_id=None), None
