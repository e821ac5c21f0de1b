"""Secrets a config points at (the broker password, the API token, the webhook URL), read from files.

What: :func:`read_secret_file` reads one, resolving a relative path against
``$CREDENTIALS_DIRECTORY`` (systemd ``LoadCredential=``); :func:`resolve_password` gives the broker
password, inline or from ``bus.password_file``.

Why apart from validation: a secret is read when a daemon starts or a call needs it, not when the
file is checked (``ftd check-config`` runs outside the service's credential sandbox), and a rotated
secret is re-read without reloading the config.
"""

from __future__ import annotations

import os
from pathlib import Path

from ftd.config.errors import ConfigError, Problem
from ftd.config.paths import os_reason
from ftd.config.schema import BusConfig

__all__ = ["read_secret_file", "resolve_password"]


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
