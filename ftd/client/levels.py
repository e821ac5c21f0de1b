"""Can a checkpoint level take a save now? The client's own probe of a save directory.

What: :func:`probe` says why a directory cannot take ``need`` more bytes -- ``read-only`` (the
mount's flag, or a write refused with EROFS/EACCES), ``full`` (fewer free blocks or inodes than the
save needs) or ``not responding`` (``statvfs`` did not return within ``timeout_s``: a hard NFS mount
whose server is gone blocks forever) -- or ``""`` when it can. The same three checks the agent runs
on a declared ``checkpoint_dir`` (``ftd/agent/save_path.py``), here run by the checkpoint tier
before writing each level (local, partner, shared), from its background thread: a level that cannot
take a save is skipped and said, and never blocks training.

Why its own: the trainer client is standard library only and cannot import the agent; a stuck
``statvfs`` is left behind in a daemon thread (it cannot be cancelled), and that directory is then
called not responding until the thread returns.
"""

from __future__ import annotations

import os
import threading

__all__ = ["probe"]

_STUCK: set[str] = set()  # directories whose statvfs has not returned yet
_STUCK_LOCK = threading.Lock()


def _statvfs(path: str, timeout_s: float) -> os.statvfs_result | None:
    """``os.statvfs(path)`` within ``timeout_s``; None when it did not return in time."""
    with _STUCK_LOCK:
        if path in _STUCK:
            return None
    box: list[os.statvfs_result | BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            box.append(os.statvfs(path))
        except BaseException as exc:  # reported to the caller, never raised in this thread
            box.append(exc)
        finally:
            with _STUCK_LOCK:
                _STUCK.discard(path)
            done.set()

    with _STUCK_LOCK:
        _STUCK.add(path)
    threading.Thread(target=run, name="ftd-ckpt-probe", daemon=True).start()
    if not done.wait(timeout_s):
        return None
    result = box[0]
    if isinstance(result, BaseException):
        raise result
    return result


def probe(path: str, need: int = 0, timeout_s: float = 5.0) -> str:
    """Why ``path`` (created if missing) cannot take a save of ``need`` bytes, or ``""``."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        if exc.errno in (30, 13):  # EROFS, EACCES
            return f"{path}: read-only ({exc.strerror})"
        if exc.errno == 28:  # ENOSPC
            return f"{path}: full ({exc.strerror})"
        return f"{path}: cannot be created ({exc.strerror or exc})"
    try:
        st = _statvfs(path, timeout_s)
    except OSError as exc:
        return f"{path}: cannot be checked ({exc.strerror or exc})"
    if st is None:
        return f"{path}: not responding (statvfs did not return within {timeout_s:g}s)"
    if st.f_flag & os.ST_RDONLY:
        return f"{path}: read-only (mounted read-only)"
    if not os.access(path, os.W_OK):
        return f"{path}: read-only (no write permission)"
    free = st.f_bavail * st.f_frsize
    if free < need or st.f_bavail == 0:
        return f"{path}: full ({free} bytes free, the save needs {need})"
    if st.f_files and st.f_favail == 0:
        return f"{path}: full (no inode left)"
    return ""
