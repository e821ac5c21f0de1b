"""An ordinary (unprivileged) local user for the security tests, and running commands as it.

:func:`trainer_user` creates the system user ``ftd-trainer`` and the group ``ftd-trainers`` (its
supplementary group) with ``groupadd``/``useradd`` when missing (needs root), and a second user
``ftd-other`` outside that group. Commands run as them through ``runuser -u``. They use the
system Python (``/usr/bin/python3``): the venv's interpreter lives under ``/root``, which other
users cannot traverse, and the trainer client needs the standard library only.

Without root or the tools the test is skipped, or fails under ``FTD_REQUIRE_REAL=1``.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ftd.agent.local_api import LocalApi
from ftd.client import protocol
from tests.realparts import REQUIRE_REAL, require_binary
from tests.unit.helpers import Recorder

REPO = Path(__file__).resolve().parents[2]
GROUP = "ftd-trainers"
USER = "ftd-trainer"
OTHER = "ftd-other"
PYTHON = "/usr/bin/python3"


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int

    def argv(self, *command: str) -> list[str]:
        """``command`` run as this user (a login-free ``runuser``; groups from /etc/group)."""
        runuser = shutil.which("runuser") or "/usr/sbin/runuser"
        return [runuser, "-u", self.name, "--", *command]


def _unavailable(msg: str) -> None:
    if REQUIRE_REAL:
        pytest.fail(f"FTD_REQUIRE_REAL=1 and {msg}", pytrace=False)
    pytest.skip(msg)


def _ensure(name: str, groups: list[str]) -> User:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        cmd = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name]
        if groups:
            cmd[1:1] = ["--groups", ",".join(groups)]
        subprocess.run(cmd, check=True, capture_output=True, timeout=30)
        entry = pwd.getpwnam(name)
    for group in groups:
        if name not in grp.getgrnam(group).gr_mem:
            subprocess.run(["usermod", "-a", "-G", group, name], check=True, capture_output=True, timeout=30)
    return User(name=name, uid=entry.pw_uid, gid=entry.pw_gid)


def trainer_users() -> tuple[User, User, int]:
    """(``ftd-trainer`` in ``ftd-trainers``, ``ftd-other`` not in it, the group's gid)."""
    if os.geteuid() != 0:
        _unavailable("creating and switching to an unprivileged user needs root")
    for tool, package in (("useradd", "passwd"), ("groupadd", "passwd"), ("runuser", "util-linux")):
        require_binary(tool, package=package)
    if not os.access(PYTHON, os.X_OK):
        _unavailable(f"{PYTHON} (the system Python, for the unprivileged trainer) is missing")
    try:
        gid = grp.getgrnam(GROUP).gr_gid
    except KeyError:
        subprocess.run(["groupadd", "--system", GROUP], check=True, capture_output=True, timeout=30)
        gid = grp.getgrnam(GROUP).gr_gid
    return _ensure(USER, [GROUP]), _ensure(OTHER, []), gid


def run_as(
    user: User, script: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run a Python ``script`` as ``user`` with exactly ``env`` (plus PYTHONPATH to this checkout)."""
    full = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **env}
    argv = user.argv("env", "-i", *(f"{k}={v}" for k, v in full.items()), PYTHON, "-c", script)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd="/")


def popen_as(user: User, script: str, env: dict[str, str]) -> subprocess.Popen[str]:
    full = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **env}
    argv = user.argv("env", "-i", *(f"{k}={v}" for k, v in full.items()), PYTHON, "-c", script)
    return subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/"
    )


#: A script that sends one line (``$MSG``) to the agent's socket (``$FTD_SOCKET``) and prints the answer:
#: what an unprivileged process on the node can do with the socket (run it with :func:`run_as`).
SEND_LINE = r"""
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["FTD_SOCKET"])
s.sendall(os.environ["MSG"].encode() + b"\n")
s.settimeout(5)
print(s.makefile("rb").readline().decode().strip(), flush=True)
"""


def socket_dir(prefix: str) -> Iterator[str]:
    """A short directory other users can reach (unix socket paths are short), removed after."""
    path = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def served_local_api(rundir: str, on_hook: Any) -> AsyncIterator[LocalApi]:
    """A real :class:`LocalApi` on ``rundir/agent.sock``, socket group :data:`GROUP`; hooks to ``on_hook``."""
    rec = Recorder()
    api = LocalApi(
        os.path.join(rundir, "agent.sock"),
        "node-1",
        rec.on_presence,
        rec.on_ack,
        socket_group=GROUP,
        on_hook=on_hook,
    )
    await api.start()
    try:
        yield api
    finally:
        await api.stop()


async def send_as_root(path: str, msg: dict[str, Any]) -> dict[str, Any]:
    """Send ``msg`` to the socket as this (root) process; the answer."""
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(protocol.encode(msg))
    await writer.drain()
    async with asyncio.timeout(5):
        line = await reader.readline()
    writer.close()
    answer: dict[str, Any] = json.loads(line)
    return answer
