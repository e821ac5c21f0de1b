"""Mosquitto credentials for benches and tests that hold many node sessions: a password file and the ACL.

Why write the password file here instead of running ``mosquitto_passwd -b`` per node: one process per
node is minutes for 10,000 nodes. The entries are the format Mosquitto 2.0's ``mosquitto_passwd``
writes (``user:$7$<iterations>$<base64 salt>$<base64 PBKDF2-HMAC-SHA512>``, 101 iterations, 12-byte
salt); the broker checks them exactly as it checks the ones the tool makes.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["password_entry", "shipped_acl", "write_password_file"]

_ITERATIONS = 101  # mosquitto_passwd's default for $7$ (PBKDF2-SHA512)


def password_entry(user: str, password: str, salt: bytes | None = None) -> str:
    """One line of a Mosquitto 2.0 password file."""
    if ":" in user or "\n" in user:
        raise ValueError(f"invalid user name {user!r}")
    salt = os.urandom(12) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, _ITERATIONS)
    b64 = base64.b64encode
    return f"{user}:$7${_ITERATIONS}${b64(salt).decode()}${b64(digest).decode()}"


def write_password_file(path: Path, users: Mapping[str, str]) -> None:
    """Write ``users`` (name -> password) as a password file readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("".join(password_entry(user, password) + "\n" for user, password in users.items()))


def shipped_acl() -> str:
    """The ACL ftd ships (``deploy/mosquitto/acl``), from the source tree."""
    path = Path(__file__).resolve().parents[2] / "deploy" / "mosquitto" / "acl"
    if not path.exists():
        raise RuntimeError(f"{path} not found: run the bench from a source checkout of ftd")
    return path.read_text()
