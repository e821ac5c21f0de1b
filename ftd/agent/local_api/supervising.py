"""The rank-supervisor side of the local API (``ftd run``, issue #24): the protocol, apart from the server.

What: :class:`SupervisorDesk` answers the two ops a job's rank supervisor sends, ``supervise`` (same
rights as a rank's ``register``) and ``supervisor_state`` (on every change), keeps what they said in
the :class:`~ftd.agent.local_api.supervisors.SupervisorBook`, hands a supervisor that connects the
directives pending for it (``restart``, ``stop``, ``release``: it ignores a generation it already acted
on), publishes the job's presence at once on each change, and reports a ``supervisor`` event when one
fails or is lost (its connection closed without the ``exited`` goodbye); a job that ends or starts again
here forgets a supervisor lost or exited then.

Why apart: the server (:mod:`ftd.agent.local_api.server`) accepts connections and moves lines for
ranks, hooks and supervisors alike; what a supervisor's line, state or closed connection means is this
module's job. It does no I/O of its own: it answers through the callables the server gives it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ftd.agent.local_api import registration, wire
from ftd.agent.local_api.pending import PendingDirectives
from ftd.agent.local_api.state import Conn
from ftd.agent.local_api.supervisors import (
    SUPERVISOR_ACTIONS,
    SupervisorBook,
    checked,
    supervisor_event,
)
from ftd.agent.peer import ProcFs
from ftd.client import protocol
from ftd.events import Event, SupervisorInfo
from ftd.logs import get_logger

__all__ = ["SupervisorDesk"]

log = get_logger(__name__)


class SupervisorDesk:
    """The rank supervisors of one agent's local API; see the module docstring."""

    def __init__(
        self,
        node: str,
        *,
        counters: dict[str, int],
        pending: PendingDirectives,
        proc: ProcFs,
        send: Callable[[Conn, bytes], bool],
        bad: Callable[[Conn, str | None, str], None],
        emit: Callable[[Event], None],
        presence_now: Callable[[str], None],
        stopping: Callable[[], bool],
    ) -> None:
        self.node = node
        self._counters = counters
        self._pending = pending
        self._proc = proc
        self._send = send
        self._bad = bad
        self._emit = emit
        self._presence_now = presence_now
        self._stopping = stopping
        self._book = SupervisorBook()
        for name in ("supervisors", "supervisors_refused", "supervisors_lost", "supervisors_failed"):
            counters.setdefault(name, 0)

    # --- queries -----------------------------------------------------------------------------

    def get(self, job: str) -> SupervisorInfo | None:
        """The job's supervisor as it last reported (``lost`` / ``exited`` once gone), or None."""
        return self._book.get(job)

    def all(self) -> dict[str, SupervisorInfo]:
        """Every job's supervisor on this node, by job."""
        return {job: info for job in self._book.jobs() if (info := self._book.get(job))}

    def conn(self, job: str) -> Conn | None:
        """The connection of the job's supervisor, while it is connected."""
        return self._book.conn(job)

    def reset(self) -> None:
        """The agent's local API stopped: the supervisors say ``supervise`` again on its next start
        (what they said before would be stale in the presence)."""
        self._book = SupervisorBook()

    def job_ended(self, job: str) -> None:
        """``job`` ended or starts again on this node: a supervisor of it gone here is forgotten (one
        still connected stays: it ends with the job's step and says goodbye)."""
        if self._book.forget_lost(job) is not None:
            log.info("local_api_supervisor_forgotten", job=job, why="the job ended or started again here")

    # --- the protocol ------------------------------------------------------------------------

    def supervise(self, conn: Conn, msg: wire.Supervise) -> None:
        """``supervise``: ``conn`` is the job's rank supervisor from now on (if the rules allow it)."""
        if conn.job is not None or conn.supervising is not None:
            held = (
                f"job {conn.job} rank {conn.rank}"
                if conn.job is not None
                else f"supervisor of {conn.supervising}"
            )
            self._bad(conn, protocol.SUPERVISE, f"this connection is already registered as {held}")
            return
        why = registration.refusal(conn, msg, self._proc)
        cred = conn.cred
        if why is not None:
            self._counters["supervisors_refused"] += 1
            log.warning(
                "supervise_refused",
                job=msg.job,
                pid=cred.pid if cred else None,
                uid=cred.uid if cred else None,
                reason=why,
            )
            self._send(conn, wire.error_line(protocol.SUPERVISE, why[:500]))
            return
        pid = msg.pid if msg.pid is not None else msg.info.pid
        if cred is not None and conn.identity is not None and not conn.identity.any_job:
            pid = cred.pid  # the kernel's word, as for a rank
        info = checked(msg.info, time.time(), pid, protocol.TEXT_MAX)
        if isinstance(info, str):
            self._bad(conn, protocol.SUPERVISE, info)
            return
        conn.supervising = msg.job
        replaced = self._book.supervise(msg.job, conn, info)
        if replaced is not None:
            log.warning(
                "local_api_supervisor_replaced", job=msg.job, pid=pid, why="a new supervise for the job"
            )
        self._counters["supervisors"] += 1
        self._send(conn, wire.line({**protocol.ok(protocol.SUPERVISE), "node": self.node}))
        owed = [
            p
            for p in self._pending.owed_to(msg.job, -1, time.monotonic())
            if p.directive.job == msg.job and p.directive.action in SUPERVISOR_ACTIONS
        ]
        for pending in owed:
            self._send(conn, pending.line)
        log.info(
            "local_api_supervisor_registered",
            job=msg.job,
            pid=pid,
            role=info.role,
            slot=info.slot,
            generation=info.generation,
            state=info.state,
            pending_sent=[p.directive.id for p in owed],
        )
        self._changed(msg.job, None, info)

    def state(self, conn: Conn, msg: wire.SupervisorStateMsg) -> None:
        """``supervisor_state``: what the supervisor on ``conn`` says it does now."""
        job = conn.supervising
        if job is None:
            self._bad(conn, protocol.SUPERVISOR_STATE, "not supervising: send supervise first")
            return
        current = self._book.get(job)
        info = checked(msg.info, time.time(), current.pid if current else msg.info.pid, protocol.TEXT_MAX)
        if isinstance(info, str):
            self._bad(conn, protocol.SUPERVISOR_STATE, info)
            return
        before = self._book.update(conn, info)
        if before is None:
            log.info(
                "local_api_supervisor_state_ignored", job=job, why="another connection supervises the job"
            )
            return
        log.info(
            "local_api_supervisor_state",
            job=job,
            role=info.role,
            slot=info.slot,
            generation=info.generation,
            state=info.state,
            was=before.state,
            exit_code=info.exit_code,
            reason=info.reason[:200] or None,
        )
        self._changed(job, before, info)

    def closed(self, conn: Conn) -> None:
        """``conn`` closed: a supervisor that said goodbye left; one that did not is lost (an event)."""
        job = conn.supervising
        if job is None or self._stopping():  # the agent stops, not the supervisor: it reconnects
            return
        closed, info = self._book.closed(conn, time.time())
        if closed == "replaced" or info is None:
            return
        if closed == "lost":
            self._counters["supervisors_lost"] += 1
            log.warning(
                "local_api_supervisor_lost",
                job=job,
                pid=info.pid,
                role=info.role,
                slot=info.slot,
                generation=info.generation,
                why="its connection closed without the exited goodbye",
            )
            self._emit(supervisor_event(self.node, job, info))
        else:
            log.info("local_api_supervisor_left", job=job, pid=info.pid, exit_code=info.exit_code)
        self._presence_now(job)

    def _changed(self, job: str, before: SupervisorInfo | None, info: SupervisorInfo) -> None:
        """Publish the job's presence now; a newly failed supervisor is an event."""
        if not self._stopping():
            self._presence_now(job)
        failed_now = info.state == "failed" and (
            before is None
            or before.state != "failed"
            or before.generation != info.generation
            or before.reason != info.reason
        )
        if failed_now:
            self._counters["supervisors_failed"] += 1
            self._emit(supervisor_event(self.node, job, info))
