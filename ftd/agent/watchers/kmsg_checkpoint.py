"""The kmsg watcher's position file, which is also storm control's checkpoint.

One small JSON file (``kmsg.position`` in the agent's state dir) holds where the kernel-log watcher
is in its source: for ``/dev/kmsg`` the boot id and the last sequence number handled; for a file its
inode, the byte offset of the first line not fully handled and, when present, ``done``: how many
events of that line were already handled (a line checkpointed between two of its events). With
storm control in front of the outbox it also holds :class:`~ftd.agent.storm.StormState` under
``"storm"``: pending repeat counts and events about to be published, written together with the
position so that a ``kill -9`` can neither lose a count nor make one count twice (see
:mod:`ftd.agent.storm`).

:class:`KmsgCheckpoint` is shared by the two without either calling the other: the watcher moves the
position (plain attributes, set as it reads, no call per line) and saves it itself when it runs
without storm control; storm control saves it, with its snapshot, ahead of every publish. The file
is read once, when the checkpoint is made: the watcher starts from the position, storm control
restores its state from :meth:`KmsgCheckpoint.saved`.

Writing is frequent (ahead of every publish in a storm), so :class:`_StateFile` overwrites the file
in place when it can and replaces it otherwise; with ``fsync`` (the agent passes the spool's
setting) every write is flushed to disk, so a power cut cannot leave an older checkpoint behind a
newer spool.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import msgspec

from ftd.agent.storm import StormState
from ftd.fileio import write_atomic
from ftd.logs import get_logger

__all__ = ["KmsgCheckpoint"]

log = get_logger(__name__)


class KmsgCheckpoint:
    """The watcher's read position and, with storm control, its state; see the module docstring.

    ``path=None`` keeps the position in memory only (nothing is read or written)."""

    def __init__(self, path: Path | None, *, fsync: bool = False) -> None:
        self.path = path
        self.fsync = fsync  # flush the file to disk on every write (as the spool's ``fsync``)
        self.kind: str | None = None  # "file" | "device" once known
        self.source: int | str | None = None  # the file's inode, the device's boot id
        self.mark: int | None = None  # file: offset of the first line not fully handled; device: last seq
        self.done = 0  # events of the line after the mark already handled
        self._storm: Any = None  # storm control's part as read from the file (see saved())
        self._write_failed = False
        self._file: _StateFile | None = None
        self._load()

    def _load(self) -> None:
        if self.path is None:
            return
        try:
            state = msgspec.json.decode(self.path.read_bytes())
        except FileNotFoundError:
            return
        except (OSError, msgspec.DecodeError) as exc:
            log.warning("kmsg_state_unreadable", path=str(self.path), error=str(exc))
            return
        if not isinstance(state, dict):
            return
        done = state.get("done", 0)
        self.done = done if isinstance(done, int) and done > 0 else 0
        if state.get("kind") == "file":
            self.kind, self.source = "file", state.get("inode")
            offset = state.get("offset")
            self.mark = offset if isinstance(offset, int) else None
        elif state.get("kind") == "device":
            self.kind, self.source = "device", state.get("boot_id")
            seq = state.get("seq")
            self.mark = seq if isinstance(seq, int) else None
        self._storm = state.get("storm")

    def saved(self) -> StormState | None:
        """Storm control's state as the file held it when the checkpoint was made (None: nothing, or
        unreadable: those counts are lost, but the agent runs)."""
        if self._storm is None:
            return None
        try:
            return msgspec.convert(self._storm, StormState)
        except (msgspec.ValidationError, ValueError) as exc:
            log.error("kmsg_storm_state_unreadable", path=str(self.path), error=str(exc)[:300])
            return None

    def save(self, storm: StormState | None = None) -> None:
        """Write the position (and storm control's ``storm``) atomically; a failed write is logged
        once per spell of failures and retried with a fresh file on the next save."""
        if self.path is None or (self.kind is None and storm is None):
            return
        state: dict[str, Any] = {}
        if self.mark is not None:
            if self.kind == "file":
                state = {"kind": "file", "inode": self.source, "offset": self.mark}
            elif self.kind == "device":
                state = {"kind": "device", "boot_id": self.source, "seq": self.mark}
            if state and self.done:
                state["done"] = self.done
        if storm is not None:
            state["storm"] = storm
        if self._file is None:
            self._file = _StateFile(self.path, fsync=self.fsync)
        try:
            self._file.write(msgspec.json.encode(state))
        except OSError as exc:
            self._file.close()  # start over with a fresh file next time
            if not self._write_failed:  # once per failure spell: a full disk must not flood the log
                log.warning("kmsg_state_write_failed", path=str(self.path), error=str(exc))
            self._write_failed = True
        else:
            self._write_failed = False


_PAGE = 4096


class _StateFile:
    """The position file, written often (storm control checkpoints ahead of every publish).

    Replacing it (write a temp file, rename) costs ~100 us on ext4; so once it exists it is
    overwritten in place with one ``pwrite`` at offset 0 (under 1 us), padded with spaces to the
    file's length (JSON allows trailing whitespace), which a kill cannot tear: content of at most a
    page, written by one call, is copied whole or not at all (the kernel looks for a fatal signal
    before each page it copies). A reader running at the same moment may see a mix (it reads again).
    Larger content, and every write when ``fsync`` is set (durable across a power cut: file and
    directory flushed, as the spool does), replace the file instead."""

    def __init__(self, path: Path, *, fsync: bool) -> None:
        self.path = path
        self.fsync = fsync
        self._handle: io.FileIO | None = None  # open for overwriting (closed with the object)
        self._size = 0

    def write(self, data: bytes) -> None:
        if self.fsync or len(data) > _PAGE or self._handle is None:
            self._replace(data)
            return
        if len(data) < self._size:
            data = data.ljust(self._size)
        if os.pwrite(self._handle.fileno(), data, 0) != len(data):
            self._replace(data.rstrip())
            return
        self._size = len(data)

    def _replace(self, data: bytes) -> None:
        self.close()
        try:
            write_atomic(self.path, data, fsync=self.fsync, mode=0o644)
        except FileNotFoundError:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, data, fsync=self.fsync, mode=0o644)
        if not self.fsync and len(data) <= _PAGE:
            self._handle = io.FileIO(self.path, "r+")
            self._size = len(data)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
