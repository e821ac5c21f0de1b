"""The rank supervisors (``ftd run``, issue #24) connected to this node's agent, one per job.

What: :class:`SupervisorBook`, which job's supervisor is on which connection and what it last said
(:class:`ftd.events.SupervisorInfo`), and :func:`supervisor_event`, the ``supervisor`` event for one
that was lost or failed. A supervisor that closes its connection after reporting ``exited`` said
goodbye and stays in the book as ``exited`` (with its exit code); one whose connection closes
otherwise (killed, crashed) stays in it as ``lost``; either until the job ends or starts again on
this node, or a supervisor of the job connects again, so the job's presence keeps saying how this
node's supervisor ended. Why apart: the server only
moves lines; what a close or a state change means for the presence and the events is decided here,
without I/O (the server sends what these functions return).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec

from ftd.agent.local_api.state import Conn
from ftd.client.protocol import RUN_MAX
from ftd.events import Event, Kind, Severity, SupervisorInfo, make_event

__all__ = ["SUPERVISOR_ACTIONS", "SUPERVISOR_ONLY", "Closed", "SupervisorBook", "checked", "supervisor_event"]

SUPERVISOR_ACTIONS = frozenset({"restart", "stop", "release"})
"""The directive actions a job's supervisor receives."""
SUPERVISOR_ONLY = frozenset({"restart", "release"})
"""The ones that reach no rank (and are bound to no run of the ranks)."""

Closed = Literal["goodbye", "lost", "replaced"]
"""What a supervisor's closed connection meant: it said goodbye (``exited``), it was lost, or another
connection had already taken its job over (nothing changes)."""


@dataclass(eq=False)
class Supervised:
    conn: Conn | None  # None once its connection closed without a goodbye (``lost``)
    info: SupervisorInfo


class SupervisorBook:
    """The job -> supervisor book of one agent."""

    def __init__(self) -> None:
        self._by_job: dict[str, Supervised] = {}

    def get(self, job: str) -> SupervisorInfo | None:
        entry = self._by_job.get(job)
        return entry.info if entry is not None else None

    def conn(self, job: str) -> Conn | None:
        entry = self._by_job.get(job)
        return entry.conn if entry is not None else None

    def jobs(self) -> list[str]:
        return sorted(self._by_job)

    def supervise(self, job: str, conn: Conn, info: SupervisorInfo) -> Conn | None:
        """``conn`` supervises ``job`` now; returns the connection it replaced (None: none)."""
        old = self._by_job.get(job)
        self._by_job[job] = Supervised(conn, info)
        return old.conn if old is not None and old.conn is not conn else None

    def update(self, conn: Conn, info: SupervisorInfo) -> SupervisorInfo | None:
        """The supervisor on ``conn`` reported ``info``; returns what it said before (None when
        ``conn`` no longer holds its job: a newer connection took it over)."""
        job = conn.supervising
        entry = self._by_job.get(job) if job is not None else None
        if entry is None or entry.conn is not conn:
            return None
        before, entry.info = entry.info, info
        return before

    def closed(self, conn: Conn, ts: float) -> tuple[Closed, SupervisorInfo | None]:
        """The supervisor's connection closed: a goodbye after ``exited`` (kept as ``exited``: the
        job's presence says how it ended, which the coordinator needs to release a finished job's
        spares, even after a restart), else it is ``lost`` (kept, with that state); ``replaced`` when
        another connection holds the job."""
        job = conn.supervising
        entry = self._by_job.get(job) if job is not None else None
        if job is None or entry is None or entry.conn is not conn:
            return "replaced", None
        entry.conn = None
        if entry.info.state == "exited":
            entry.info = msgspec.structs.replace(entry.info, ts=ts)
            return "goodbye", entry.info
        entry.info = msgspec.structs.replace(entry.info, state="lost", ts=ts)
        return "lost", entry.info

    def forget_lost(self, job: str) -> SupervisorInfo | None:
        """Forget the job's supervisor if it is gone, lost or exited (the job ended, or starts again
        here)."""
        entry = self._by_job.get(job)
        if entry is None or entry.conn is not None:
            return None
        del self._by_job[job]
        return entry.info


ADDR_MAX = 256
"""Longest ``addr`` kept (a host name or an address); a longer ``reason`` is cut to TEXT_MAX."""


def checked(info: SupervisorInfo, ts: float, pid: int | None, text_max: int) -> SupervisorInfo | str:
    """``info`` as the agent keeps it (``pid`` and ``ts`` its own, ``reason`` cut to ``text_max``), or
    why it is refused: numbers a supervisor cannot mean (a negative slot or generation, no nodes)."""
    if info.slot is not None and not 0 <= info.slot < max(info.nodes, 1):
        return f"slot {info.slot} is not in 0..{info.nodes - 1}"
    if info.generation < 0 or info.nodes < 1 or info.nproc < 1:
        return "generation must be >= 0, nodes and nproc >= 1"
    if len(info.addr) > ADDR_MAX:
        return f"addr longer than {ADDR_MAX} characters"
    return msgspec.structs.replace(
        info, pid=pid, ts=ts, reason=info.reason[:text_max], run=info.run[:RUN_MAX]
    )


def supervisor_event(node: str, job: str, info: SupervisorInfo) -> Event:
    """The ``supervisor`` event (severity error) for a supervisor ``lost`` or ``failed`` on ``node``."""
    data: dict[str, object] = {
        "job": job,
        "state": info.state,
        "role": info.role,
        "slot": info.slot,
        "generation": info.generation,
    }
    if info.state == "failed":
        data["reason"] = info.reason
    return make_event(node, Kind.SUPERVISOR, severity=Severity.ERROR, source="agent", data=data)
