"""What is wrong with one path a config names, as the daemon would use it: a reason, or ``None``.

What: one function per way a daemon uses a path: :func:`file_problem` (a regular file it reads),
:func:`ca_bundle_problem` (a CA bundle it loads), :func:`kernel_log_problem` (the kmsg source:
character device, FIFO or file), :func:`dir_problem` (a directory it reads),
:func:`writable_dir_problem` (a directory it writes, created with its parents when missing),
:func:`database_problem` (an SQLite file and its directory), :func:`socket_problem` (a unix socket
it binds), :func:`command_problem` (an executable) and :func:`statvfs_problem` (a watched mount).
Each returns a short sentence naming the path (``cannot read /etc/ftd/ca.pem: No such file or
directory``) or ``None`` when the path is usable.

Why separate from the config's keys: these are about the machine, not the schema (the checker that
applies them to a config's options is :mod:`ftd.commands.config_check.references`), and each is tested on
real files, FIFOs, devices and permissions. They look (stat, access, open-and-close) and never create,
write or consume anything: ``ftd check-config`` must be safe to run next to a live daemon. Permission
answers are those of the user running the check; they say so (``as user nobody``) because
``check-config`` may not run as the service's user.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

__all__ = [
    "ca_bundle_problem",
    "command_problem",
    "database_problem",
    "dir_problem",
    "file_problem",
    "kernel_log_problem",
    "os_reason",
    "socket_problem",
    "statvfs_problem",
    "writable_dir_problem",
]


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return f"uid {os.geteuid()}"


def os_reason(exc: OSError) -> str:
    """``No such file or directory``; on a permission error, also who asked (``(as user nobody)``)."""
    text = exc.strerror or str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM):
        text += f" (as user {_user()})"
    return text


def _reason(verb: str, path: str | Path, exc: OSError) -> str:
    """``cannot read PATH: No such file or directory``."""
    return f"cannot {verb} {path}: {os_reason(exc)}"


def _denied(verb: str, path: str | Path) -> str:
    return _reason(verb, path, PermissionError(errno.EACCES, os.strerror(errno.EACCES)))


def _stat(path: str | Path, verb: str = "read") -> os.stat_result | str:
    try:
        return os.stat(path)
    except OSError as exc:
        return _reason(verb, path, exc)


def file_problem(path: str) -> str | None:
    """``path`` must be a regular file this process can open for reading."""
    st = _stat(path)
    if isinstance(st, str):
        return st
    if stat.S_ISDIR(st.st_mode):
        return f"{path} is a directory, not a file"
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        return _reason("read", path, exc)
    return None


def ca_bundle_problem(path: str) -> str | None:
    """``path`` must be a readable PEM bundle that :mod:`ssl` loads (as the daemon does at start)."""
    import ssl  # not at module level: ``import ftd.config`` stays light

    if problem := file_problem(path):
        return problem
    try:
        ssl.create_default_context(cafile=path)
    except ssl.SSLError as exc:
        return f"{path} is not a usable CA bundle: {exc.reason or exc}"
    except OSError as exc:
        return _reason("read", path, exc)
    return None


def kernel_log_problem(path: str) -> str | None:
    """The kmsg source: a character device or a regular file opened for reading, or a FIFO the agent
    opens read-write. A FIFO is only checked with :func:`os.access`: opening it would release, then
    abandon, a writer blocked on it."""
    st = _stat(path)
    if isinstance(st, str):
        return st
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        return f"{path} is a directory, not a kernel log"
    if stat.S_ISFIFO(mode):
        return None if os.access(path, os.R_OK | os.W_OK) else _denied("open", path)
    if not (stat.S_ISCHR(mode) or stat.S_ISREG(mode)):
        return f"{path} is not a character device, FIFO or regular file"
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
    except OSError as exc:
        return _reason("read", path, exc)
    return None


def dir_problem(path: str) -> str | None:
    """``path`` must be a directory whose entries this process can list and read."""
    st = _stat(path)
    if isinstance(st, str):
        return st
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    return None if os.access(path, os.R_OK | os.X_OK) else _denied("read", path)


def writable_dir_problem(path: str | Path) -> str | None:
    """``path`` must be a directory this process can write in, or one it can create: then the closest
    existing ancestor must be a writable directory (``mkdir -p`` succeeds)."""
    target = Path(os.path.abspath(path))
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    st = _stat(existing, "use")
    if isinstance(st, str):
        return st
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory" if existing == target else f"{existing} is not a directory"
    if os.access(existing, os.W_OK | os.X_OK):
        return None
    if existing == target:
        return _denied("write in", path)
    return f"cannot create {path}: no write permission in {existing} (as user {_user()})"


def database_problem(path: str) -> str | None:
    """An SQLite file: read-write when it exists, and in a writable directory (its journal lives
    there; the directory is created when missing). ``:memory:`` needs nothing."""
    if path == ":memory:":
        return None
    if os.path.exists(path):
        st = _stat(path)
        if isinstance(st, str):
            return st
        if not stat.S_ISREG(st.st_mode):
            return f"{path} is not a regular file"
        if not os.access(path, os.R_OK | os.W_OK):
            return _denied("write", path)
    return writable_dir_problem(os.path.dirname(os.path.abspath(path)))


def socket_problem(path: str) -> str | None:
    """A unix socket to bind: its directory must be usable (created when missing), and what is at the
    path must be a socket (a stale one is replaced, a live one is reported when the daemon starts)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        return _reason("use", path, exc)
    if st is not None and not stat.S_ISSOCK(st.st_mode):
        return f"{path} exists and is not a socket"
    return writable_dir_problem(os.path.dirname(os.path.abspath(path)))


def command_problem(command: str) -> str | None:
    """An executable: a path (absolute or relative) or a name looked up on ``$PATH``."""
    if os.sep not in command:
        return None if shutil.which(command) else f"{command} not found on $PATH"
    st = _stat(command, "run")
    if isinstance(st, str):
        return st
    if not stat.S_ISREG(st.st_mode):
        return f"{command} is not a regular file"
    return None if os.access(command, os.X_OK) else _denied("run", command)


def statvfs_problem(path: str) -> str | None:
    """A path on a watched filesystem: :func:`os.statvfs` must work on it (the fs watcher's call)."""
    try:
        os.statvfs(path)
    except OSError as exc:
        return _reason("watch", path, exc)
    return None
