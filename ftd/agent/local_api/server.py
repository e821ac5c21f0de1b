"""The agent's local API: a unix-socket server that training ranks on this node connect to.

Why: the coordinator talks to a job through the bus, but trainers must not speak MQTT (the trainer
client is stdlib only and must be cheap and fail-open). So each node agent relays: it pushes
``save``/``stop`` directives down to the ranks it hosts, turns their acknowledgements into
:class:`ftd.events.Ack`, and watches their heartbeats (job presence for the coordinator, silence
for hang detection).

What: :class:`LocalApi`, the server: it accepts connections, identifies the peer, decodes each line
(:mod:`ftd.agent.local_api.wire`), registers ranks (the rules are
:mod:`ftd.agent.local_api.registration`), relays acks and presence through callbacks, keeps pending
directives, and answers the node hooks.

Protocol and directives
-----------------------
One JSON object per line (:mod:`ftd.client.protocol`), decoded by :mod:`ftd.agent.local_api.wire`
(never raises: a bad line gets an ``error``, the connection stays open). Acks go to ``on_ack``,
heartbeats feed :meth:`LocalApi.silent_ranks`, job presence goes out through
:mod:`ftd.agent.local_api.presence`. :meth:`LocalApi.deliver` pushes a directive to the ranks of
its job and run, pending for ranks that register later (:mod:`ftd.agent.local_api.pending`).

Registration and rights
-----------------------
A ``register`` the rules refuse is answered with an ``error`` naming the reason, counted
(``registrations_refused``) and logged (``registration_refused``, rate-limited per uid and job).
Heartbeats and acks on a connection are for the job registered on it only: an ack for a directive
this agent delivered to another job is refused (``acks_refused``).

Node hooks (issue #12)
----------------------
Besides the ranks, the node's own hooks use the socket, without registering: the Slurm Prolog and
Epilog (``job_start`` / ``job_end``), ``ftd health`` (``conditions``) and ``ftd preflight``
through the agent (``preflight``), and ``ftd inject``'s drills (``inject``,
:mod:`ftd.agent.local_api.inject`); see :mod:`ftd.client.protocol` and :mod:`ftd.agent.jobs`. Each
is decoded like any message and answered by the ``on_hook`` callback (off the connection handler);
``job_start``, ``job_end``, ``preflight`` and ``inject`` only from root or the agent's own uid (the peer
identity ``trusted_uid``), else refused with an ``error`` and counted (``hooks_refused``).

Rank supervisors (issue #24)
----------------------------
A job's rank supervisor (``ftd run``, :mod:`ftd.supervisor`) connects like a rank but says
``supervise`` and then ``supervisor_state``; the server hands those lines and the supervisor's closed
connection to :class:`~ftd.agent.local_api.supervising.SupervisorDesk` (the protocol: the book of
supervisors, the presence on each change, the ``supervisor`` event for one lost or failed) and
delivers the job's ``restart``, ``stop`` and ``release`` directives to the supervisor it keeps.

Whose pid is whose: :meth:`LocalApi.owner_of` (:mod:`ftd.agent.local_api.owners`) names the rank of a
process, registered now or whose connection closed a short while ago; the agent's one door
(:mod:`ftd.agent.door`) adds it to a segfault that names the pid.

Thread-safety: everything here runs on the agent's event loop; call it from that loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import stat
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

import msgspec

from ftd.agent.checkpoints import (
    CheckpointReport,
    VerifiedCopies,
    names_manifest,
    verify_ack,
    verify_report,
)
from ftd.agent.jobs import ConditionsMsg, HookMsg, JobEndMsg, JobStartMsg, PreflightMsg
from ftd.agent.local_api import registration, wire
from ftd.agent.local_api.callbacks import CallbackQueue
from ftd.agent.local_api.flight_desk import FlightAnswer, FlightDesk
from ftd.agent.local_api.inject import PRIVILEGED_OPS, InjectMsg
from ftd.agent.local_api.owners import Owner, RankOwners
from ftd.agent.local_api.pending import PendingDirectives
from ftd.agent.local_api.presence import PresenceReports
from ftd.agent.local_api.state import Conn
from ftd.agent.local_api.supervising import SupervisorDesk
from ftd.agent.local_api.supervisors import SUPERVISOR_ACTIONS, SUPERVISOR_ONLY
from ftd.agent.peer import ProcFs, identify, peer_cred
from ftd.client import protocol
from ftd.client.protocol import MAX_LINE, PROTOCOL_VERSION
from ftd.events import Ack, Directive, Event, RankInfo, StepTiming, SupervisorInfo
from ftd.logs import get_logger

log = get_logger(__name__)

__all__ = ["AckCallback", "EventCallback", "HookCallback", "LocalApi", "PresenceCallback"]

MAX_WRITE_BUFFER = 1024 * 1024
"""A client that lets more than this pile up unread is disconnected (it reconnects and re-registers)."""
MAX_CONNECTIONS = 4096
#: Checkpoint manifests verified or waiting for a worker at once (issue #34); a report beyond it is
#: answered with an error and a save's acknowledgement relayed as a failed save, never queued.
MAX_VERIFY_BACKLOG = 64
_STOP = frozenset({"stop"})


PresenceCallback = Callable[[str, list[RankInfo]], Awaitable[None]]
AckCallback = Callable[[Ack], Awaitable[None]]
EventCallback = Callable[[Event], Awaitable[None]]
"""Publishes an event this API observed (a rank supervisor lost or failed)."""
HookCallback = Callable[[HookMsg | InjectMsg], Awaitable[Mapping[str, Any]]]
"""Answers a node hook's message (Prolog, Epilog, ``ftd health``): the reply to send (see
:mod:`ftd.agent.jobs`)."""


class LocalApi:
    """Unix-socket server for the trainer ranks of one node; see the module docstring for the protocol."""

    def __init__(
        self,
        socket_path: str,
        node: str,
        on_presence: PresenceCallback,
        on_ack: AckCallback,
        *,
        socket_mode: int = 0o660,
        socket_group: str | int | None = None,
        pending_ttl_s: float = 600.0,
        proc: ProcFs | None = None,
        on_hook: HookCallback | None = None,
        on_event: EventCallback | None = None,
    ) -> None:
        self.socket_path = socket_path
        self._on_hook = on_hook
        self._on_event = on_event
        self._socket_dir = os.path.dirname(os.path.abspath(socket_path))
        self.node = node
        self._on_presence = on_presence
        self._on_ack = on_ack
        self._socket_mode = socket_mode
        self._socket_group = socket_group
        self._proc = proc or ProcFs()
        self._trusted_uids = frozenset({0, os.geteuid()})
        self._refusals_logged: OrderedDict[tuple[int, str], int] = OrderedDict()
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[Conn] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._jobs: dict[str, set[Conn]] = {}
        self._owners = RankOwners(self._live_pids)  # whose process a pid is, ranks that just left too
        self._pending = PendingDirectives(pending_ttl_s)
        self._presence = PresenceReports(
            self._ranks,
            lambda job: job in self._jobs,
            lambda job, ranks: self._calls.put(lambda: self._on_presence(job, ranks)),
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._hook_tasks: set[asyncio.Task[None]] = set()
        self._verifying = 0  # checkpoint manifests being verified or waiting for a worker (issue #34)
        self.verified_copies = VerifiedCopies(node)  # to say which verified copies were deleted since
        self._stopping = False
        self.counters: dict[str, int] = {
            "connections": 0,
            "registrations": 0,
            "registrations_refused": 0,
            "acks_refused": 0,
            "bad_messages": 0,
            "heartbeats": 0,
            "acks": 0,
            "directives": 0,
            "duplicate_directives": 0,
            "slow_clients_dropped": 0,
            "callback_errors": 0,
            "supervisors": 0,
            "supervisors_refused": 0,
            "supervisors_lost": 0,
            "supervisors_failed": 0,
        }
        self._calls = CallbackQueue(self.counters)
        self._supervisors = SupervisorDesk(
            node,
            counters=self.counters,
            pending=self._pending,
            proc=self._proc,
            send=self._send,
            bad=self._bad,
            emit=self._emit,
            presence_now=self._presence.now,
            stopping=lambda: self._stopping,
        )
        self._flight = FlightDesk(self._send)

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on ``socket_path``: create its directory, replace a stale socket, set its mode.

        Raises ``RuntimeError`` if another process is listening there, or the path is not a socket.
        """
        if self._server is not None:
            return
        os.makedirs(self._socket_dir, mode=0o755, exist_ok=True)
        await self._remove_stale_socket()
        self._server = await asyncio.start_unix_server(
            self._handle, path=self.socket_path, limit=MAX_LINE + 1
        )
        try:
            os.chmod(self.socket_path, self._socket_mode)
            if self._socket_group is not None:
                os.chown(self.socket_path, -1, registration.socket_gid(self._socket_group))
        except (OSError, ValueError):
            self._server.close()
            self._server = None
            with contextlib.suppress(OSError):
                os.unlink(self.socket_path)
            raise
        self._tasks = [
            asyncio.create_task(self._calls.run(), name="ftd-localapi-callbacks"),
            asyncio.create_task(self._presence.run(), name="ftd-localapi-presence"),
        ]
        log.info(
            "local_api_listening",
            path=self.socket_path,
            node=self.node,
            mode=oct(self._socket_mode),
            group=self._socket_group,
        )

    async def stop(self) -> None:
        """Stop listening, drop every connection, remove the socket file.

        Pending directives are kept: a later :meth:`start` on this object re-delivers them (to the
        supervisors too, once they say ``supervise`` again: the book of supervisors starts empty).
        """
        server, self._server = self._server, None
        if server is None:
            return
        # The ranks did not leave, the agent did: no "job left this node" presence for them.
        self._stopping = True
        server.close()
        for conn in list(self._conns):
            conn.writer.close()
        handlers = [*self._handlers, *self._hook_tasks]  # node hooks still being answered too
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                await server.wait_closed()
        # Let the callbacks already queued (acks, the presence of ranks that just left) go out.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):
                await self._calls.drain()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self._stopping = False
        # The supervisors' connections are gone with the agent's: they say supervise again on a
        # later start (what they said before would be stale in the presence).
        self._supervisors.reset()
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(self.socket_path).st_mode):
                os.unlink(self.socket_path)
        log.info("local_api_stopped", path=self.socket_path)

    async def _remove_stale_socket(self) -> None:
        try:
            st = os.lstat(self.socket_path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise RuntimeError(f"{self.socket_path} exists and is not a socket; refusing to replace it")
        try:
            async with asyncio.timeout(1.0):
                _, writer = await asyncio.open_unix_connection(self.socket_path)
        except (OSError, TimeoutError):
            os.unlink(self.socket_path)
            log.info("local_api_stale_socket_removed", path=self.socket_path)
            return
        writer.close()
        raise RuntimeError(f"another process is already listening on {self.socket_path}")

    # --- queries -----------------------------------------------------------------------------

    def jobs(self) -> dict[str, list[RankInfo]]:
        """Registered ranks by job, each list sorted by rank."""
        return {job: self._ranks(job) for job in sorted(self._jobs)}

    def owner_of(self, pid: int) -> Owner | None:
        """(job, rank) of the rank whose process is ``pid``: registered now, or whose connection
        closed a short while ago (:mod:`ftd.agent.local_api.owners`: a segfault's kernel line can be
        read after the dead rank's connection closed)."""
        return self._owners.owner(pid)

    def _live_pids(self) -> list[tuple[int, Owner]]:
        jobs = self._jobs.items()
        return [(c.pid, (job, c.rank)) for job, conns in jobs for c in conns if c.pid is not None]

    def supervisor(self, job: str) -> SupervisorInfo | None:
        """The job's rank supervisor on this node as it last reported (``lost`` once its connection
        closed without a goodbye, ``exited`` after one, until the job ends here), or None."""
        return self._supervisors.get(job)

    def supervisors(self) -> dict[str, SupervisorInfo]:
        """Every job's rank supervisor on this node, by job."""
        return self._supervisors.all()

    def hosts(self, job: str) -> bool:
        """True while ``job`` has a rank or a rank supervisor (a spare's, even lost) on this node."""
        return job in self._jobs or self._supervisors.get(job) is not None

    def ranks_silent_for(self, seconds: float, startup_s: float | None = None) -> list[tuple[str, RankInfo]]:
        """Registered ranks silent too long: :meth:`silent_ranks` without the timeouts."""
        return [(job, info) for job, info, _ in self.silent_ranks(seconds, startup_s)]

    def silent_ranks(
        self, timeout_s: float, startup_timeout_s: float | None = None
    ) -> list[tuple[str, RankInfo, float]]:
        """Registered ranks with no heartbeat for ``timeout_s`` since their last one, or, before
        their first, none for their start-up timeout since registration (the rank's own, else
        ``startup_timeout_s``, else ``timeout_s``). Each with the timeout that applied."""
        now = time.monotonic()
        silent = []
        for conn in self._conns:
            if conn.job is None:
                continue
            limit = timeout_s if conn.beaten else (conn.startup_timeout_s or startup_timeout_s or timeout_s)
            if conn.last_beat_mono <= now - limit:
                silent.append((conn.job, conn.info(), limit))
        return sorted(silent, key=lambda item: (item[0], item[1].rank))

    def pending(self) -> list[Directive]:
        """Directives still pending (not expired, not answered by every rank they reached)."""
        return self._pending.directives(time.monotonic())

    def _ranks(self, job: str) -> list[RankInfo]:
        return sorted((c.info() for c in self._jobs.get(job, ())), key=lambda r: (r.rank, r.pid or 0))

    # --- directives --------------------------------------------------------------------------

    async def deliver(self, directive: Directive) -> int:
        """Push ``directive`` to every connected rank of its job (every job if ``job`` is None).

        Returns how many ranks it reached now. The directive stays pending for ranks that register
        later (see the module docstring). A directive whose id was seen before is ignored (returns 0).
        """
        if self._pending.seen(directive.id):
            self.counters["duplicate_directives"] += 1
            log.debug("local_api_duplicate_directive", directive_id=directive.id)
            return 0
        self.counters["directives"] += 1
        body = protocol.directive(msgspec.to_builtins(directive))
        partners = directive.params.get("partners")
        if directive.action == "partners" and directive.job is not None and isinstance(partners, dict):
            generation = directive.params.get("generation")
            version = directive.params.get("version")
            body = protocol.partners(  # the trainer protocol's own op (issue #34), not a directive
                directive.job,
                {str(k): str(v) for k, v in partners.items()},
                generation if isinstance(generation, int) else None,
                version if isinstance(version, int) and not isinstance(version, bool) else None,
            )
        # A restart or release is for the supervisor (a restart starts a new run): never bound to the
        # ranks' runs.
        runs = None if directive.action in SUPERVISOR_ONLY else self._runs_of(directive)
        pending = self._pending.add(directive, wire.line(body), time.monotonic(), runs)
        jobs = [directive.job] if directive.job is not None else list(self._jobs)
        if directive.action in SUPERVISOR_ONLY:
            jobs = []  # never to a rank
        reached = 0
        supervisor = self._supervisors.conn(directive.job) if directive.job is not None else None
        if (
            supervisor is not None
            and directive.action in SUPERVISOR_ACTIONS
            and self._send(supervisor, pending.line)
        ):
            reached += 1
        for job in jobs:
            for conn in list(self._jobs.get(job, ())):
                if not pending.for_run(conn.run):
                    continue
                if self._send(conn, pending.line):
                    pending.reached.add((job, conn.rank))
                    reached += 1
        log.info(
            "local_api_directive",
            directive_id=directive.id,
            action=directive.action,
            job=directive.job,
            runs=sorted(runs) if runs is not None else None,
            reached=reached,
        )
        return reached

    async def ask_flight(self, job: str, rank: int, timeout_s: float) -> FlightAnswer:
        """Ask rank ``rank`` of ``job`` for its flight recorder's JSON dump (issue #33); the dump's
        bytes, or why there are none (not connected here, no answer in time, no dump). Bounded."""
        conn = next((c for c in self._jobs.get(job, ()) if c.rank == rank), None)
        if conn is None:
            return None, f"rank {rank} of job {job} is not connected to this agent"
        return await self._flight.ask(conn, timeout_s)

    def _runs_of(self, directive: Directive) -> frozenset[str] | None:
        """The runs of its job a directive is for: the one the coordinator named, else those of the
        job's ranks connected now (when every one of them named its run), else None (not known)."""
        named = directive.params.get(protocol.RUN_PARAM)
        if isinstance(named, str) and named:
            return frozenset({named})
        if directive.job is None:
            return None
        runs = {conn.run for conn in self._jobs.get(directive.job, ())}
        if not runs or None in runs:
            return None
        return frozenset(r for r in runs if r is not None)

    def job_started(self, job: str) -> None:
        """The scheduler says ``job`` starts (again) on this node (the Prolog's ``job_start``):
        whatever was pending for an earlier run of it is stale, and so is a supervisor lost then."""
        self._log_dropped(job, self._pending.drop(job), "the job started again on this node")
        self._supervisors.job_ended(job)  # the copies verified here stay known: it may resume from them

    def job_ended(self, job: str) -> None:
        """The scheduler says ``job`` ended on this node: a supervisor of it gone here (lost, or
        exited) is forgotten (one still connected stays: it ends with the job's step and says
        goodbye). The checkpoint copies verified here for it are no longer watched for deletion."""
        self._supervisors.job_ended(job)
        self.verified_copies.forget_job(job)

    def _log_dropped(self, job: str, dropped: list[Directive], why: str) -> None:
        for directive in dropped:
            log.info(
                "local_api_pending_dropped",
                directive_id=directive.id,
                action=directive.action,
                job=job,
                why=why,
            )

    # --- connections -------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        conn = Conn(writer=writer, connected_at=time.monotonic())
        try:
            if len(self._conns) >= MAX_CONNECTIONS:
                writer.write(wire.error_line(None, "too many connections"))
                return
            self._conns.add(conn)
            self.counters["connections"] += 1
            await self._identify(conn)
            await self._serve(conn, reader)
        except (ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:  # a bug here must cost one connection, never the agent
            log.exception("local_api_connection_error", job=conn.job, rank=conn.rank)
        finally:
            self._conns.discard(conn)
            self._unregister(conn)
            self._supervisors.closed(conn)
            writer.close()
            if task is not None:
                self._handlers.discard(task)

    async def _identify(self, conn: Conn) -> None:
        """Read the peer's credentials and find its job (``/proc`` reads, off the event loop)."""
        sock = conn.writer.get_extra_info("socket")
        conn.cred = peer_cred(sock) if sock is not None else None
        if conn.cred is not None:
            cred = conn.cred
            conn.identity = await asyncio.to_thread(
                identify, cred.pid, cred.uid, trusted_uids=self._trusted_uids, proc=self._proc
            )

    def _refuse(self, conn: Conn, msg: wire.Register, why: str) -> None:
        self.counters["registrations_refused"] += 1
        cred, ident = conn.cred, conn.identity
        assert cred is not None and ident is not None
        key = (cred.uid, msg.job)
        count = self._refusals_logged.pop(key, 0) + 1
        self._refusals_logged[key] = count
        while len(self._refusals_logged) > 1024:
            self._refusals_logged.popitem(last=False)
        if count <= 3 or count % 100 == 0:  # a client retries: log the first few, then every 100th
            log.warning(
                "registration_refused",
                job=msg.job,
                rank=msg.rank,
                claimed_pid=msg.pid,
                pid=cred.pid,
                uid=cred.uid,
                gid=cred.gid,
                source=ident.source,
                allowed=sorted(ident.jobs),
                reason=why,
                count=count,
            )
        self._send(conn, wire.error_line(protocol.REGISTER, why[:500]))

    async def _serve(self, conn: Conn, reader: asyncio.StreamReader) -> None:
        buf = b""
        discarding = False  # inside an over-long line: drop bytes until its newline
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                return
            buf += chunk
            while True:
                nl = buf.find(b"\n")
                if nl < 0:
                    break
                line, buf = buf[:nl], buf[nl + 1 :]
                if discarding:
                    discarding = False
                    continue
                if len(line) > MAX_LINE:
                    self._bad(conn, None, f"line longer than {MAX_LINE} bytes")
                    continue
                if line.strip():
                    self._on_line(conn, line)
            if len(buf) > MAX_LINE:
                if not discarding:
                    self._bad(conn, None, f"line longer than {MAX_LINE} bytes")
                discarding = True
                buf = b""
            if conn.writer.transport.is_closing():
                return
            await conn.writer.drain()

    def _on_line(self, conn: Conn, line: bytes) -> None:
        msg = wire.decode_line(line)
        if isinstance(msg, wire.BadLine):
            self._bad(conn, msg.op, msg.error)
            return
        if msg.v != PROTOCOL_VERSION:
            self._bad(conn, wire.OPS[type(msg)], f"unsupported protocol version {msg.v}")
            return
        if isinstance(msg, wire.Register):
            self._register(conn, msg)
        elif isinstance(msg, wire.Supervise):
            self._supervisors.supervise(conn, msg)
        elif isinstance(msg, wire.SupervisorStateMsg):
            self._supervisors.state(conn, msg)
        elif isinstance(msg, JobStartMsg | JobEndMsg | ConditionsMsg | PreflightMsg | InjectMsg):
            self._hook(conn, msg)
        elif conn.job is None:
            self._bad(conn, wire.OPS[type(msg)], "not registered")
        elif isinstance(msg, wire.Heartbeat):
            self._heartbeat(conn, msg)
        elif isinstance(msg, wire.CheckpointMsg):
            self._checkpoint(conn, msg)
        elif isinstance(msg, wire.FlightMsg):
            self._flight.answer(conn, msg)
        else:
            self._ack(conn, msg)

    def _register(self, conn: Conn, msg: wire.Register) -> None:
        if conn.supervising is not None:
            self._bad(conn, protocol.REGISTER, f"this connection supervises job {conn.supervising}")
            return
        if conn.job is not None:
            self._bad(conn, protocol.REGISTER, f"already registered as job {conn.job} rank {conn.rank}")
            return
        refusal = registration.refusal(conn, msg, self._proc)
        if refusal is not None:
            self._refuse(conn, msg, refusal)
            return
        conn.job, conn.rank, conn.local_rank, conn.pid = msg.job, msg.rank, msg.local_rank, msg.pid
        conn.run, conn.startup_timeout_s = msg.run, msg.startup_timeout_s
        conn.checkpoint_dir, conn.fallback_checkpoint_dir = msg.checkpoint_dir, msg.fallback_checkpoint_dir
        if conn.cred is not None and conn.identity is not None and not conn.identity.any_job:
            conn.pid = conn.cred.pid  # the kernel's word, as this agent (and py-spy) sees the process
        conn.last_beat_mono = time.monotonic()
        members = self._jobs.setdefault(msg.job, set())
        if any(other.rank == msg.rank for other in members):
            log.warning("local_api_duplicate_rank", job=msg.job, rank=msg.rank, pid=msg.pid)
        members.add(conn)
        self.counters["registrations"] += 1
        self._send(conn, wire.OK_REGISTER)
        if msg.run is not None:
            self._log_dropped(
                msg.job,
                self._pending.drop(msg.job, other_than_run=msg.run),
                f"run {msg.run} of the job registered: meant for an earlier run",
            )
        for pending in self._pending.owed_to(msg.job, msg.rank, time.monotonic(), msg.run):
            if self._send(conn, pending.line):
                pending.reached.add((msg.job, msg.rank))
        ident = conn.identity
        log.info(
            "local_api_rank_registered",
            job=msg.job,
            rank=msg.rank,
            pid=conn.pid,
            run=msg.run,
            uid=conn.cred.uid if conn.cred else None,
            identity=ident.source if ident else None,
            why=ident.detail if ident else "no peer credentials on this platform",
        )
        self._presence.now(msg.job)

    def _emit(self, event: Event) -> None:
        on_event = self._on_event
        if on_event is None:
            log.warning("local_api_event_not_published", kind=str(event.kind), why="no on_event callback")
            return
        self._calls.put(lambda: on_event(event))

    def _hook(self, conn: Conn, msg: HookMsg | InjectMsg) -> None:
        """A node hook's request (no registration): privileged ones only from root or our uid."""
        op = wire.OPS[type(msg)]
        ident = conn.identity
        if isinstance(msg, PRIVILEGED_OPS) and ident is not None and not ident.any_job:
            self.counters["hooks_refused"] = self.counters.get("hooks_refused", 0) + 1
            cred = conn.cred
            log.warning("hook_refused", op=op, uid=cred.uid if cred else None, pid=cred.pid if cred else None)
            self._send(
                conn, wire.error_line(op, f"{op} refused: only root or the agent's own user may send it")
            )
            return
        if self._on_hook is None:
            self._send(conn, wire.error_line(op, f"{op} is not served by this agent"))
            return
        hook = self._on_hook

        async def answer() -> None:
            try:
                reply = await hook(msg)
            except Exception as exc:
                log.exception("hook_failed", op=op)
                self._send(conn, wire.error_line(op, f"{op} failed: {type(exc).__name__}: {exc}"[:500]))
                return
            self._send(conn, wire.line(reply))

        task = asyncio.create_task(answer(), name=f"ftd-localapi-hook-{op}")
        self._hook_tasks.add(task)
        task.add_done_callback(self._hook_tasks.discard)

    def _unregister(self, conn: Conn) -> None:
        job = conn.job
        if job is None:
            return
        self._owners.left(conn.pid, (job, conn.rank))
        members = self._jobs.get(job)
        if members is not None:
            members.discard(conn)
            if not members:
                del self._jobs[job]
                if not self._stopping:  # the ranks left (not the agent): a stop that reached them is done
                    self._log_dropped(
                        job,
                        self._pending.drop(job, reached_only=True, actions=_STOP),
                        "every rank it reached has left",
                    )
        log.info("local_api_rank_left", job=job, rank=conn.rank, pid=conn.pid)
        if not self._stopping:
            self._presence.now(job)

    def _heartbeat(self, conn: Conn, msg: wire.Heartbeat) -> None:
        self.counters["heartbeats"] += 1
        conn.beaten = True
        conn.last_beat = time.time()
        conn.last_beat_mono = time.monotonic()
        if msg.timing is not None:  # rides along with the step's (throttled) presence report
            t = msg.timing
            conn.timing = StepTiming(steps=t.steps, step_s=t.step_s, compute_s=t.compute_s)
        if msg.step != conn.step:
            conn.step = msg.step
            assert conn.job is not None
            self._presence.moved(conn.job)

    def _report(
        self, conn: Conn, step: int, manifest: str, level: str, directive_id: str | None
    ) -> CheckpointReport:
        """What a rank said of a checkpoint, with who said it: the manifest is followed only as the
        rank's own user (its connection's uid), unless the connection may speak for any job."""
        assert conn.job is not None and conn.rank is not None
        ident = conn.identity
        trusted = conn.cred is None or (ident is not None and ident.any_job)
        return CheckpointReport(
            node=self.node,
            job=conn.job,
            rank=conn.rank,
            step=step,
            manifest=manifest,
            level=level,
            save_s=None,
            nbytes=None,
            directive_id=directive_id,
            uid=None if trusted or conn.cred is None else conn.cred.uid,
        )

    def _checkpoint(self, conn: Conn, msg: wire.CheckpointMsg) -> None:
        """A rank's checkpoint report: verified in a worker, then one ``checkpoint`` event (#34)."""
        assert conn.job is not None and conn.rank is not None
        self.counters["checkpoints"] = self.counters.get("checkpoints", 0) + 1
        if self._verifying >= MAX_VERIFY_BACKLOG:  # bounded: a flood of reports never queues unbounded
            self.counters["checkpoints_dropped"] = self.counters.get("checkpoints_dropped", 0) + 1
            self._bad(conn, "checkpoint", f"{MAX_VERIFY_BACKLOG} checkpoints already being verified here")
            return
        report = self._report(conn, msg.step, msg.manifest, msg.level, msg.directive_id)
        report = dataclasses.replace(report, save_s=msg.save_s, nbytes=msg.bytes)

        async def check() -> None:
            event = await verify_report(report)
            if not event.data.get("ok"):
                self.counters["checkpoints_rejected"] = self.counters.get("checkpoints_rejected", 0) + 1
            self.verified_copies.note(event)
            log.info(
                "local_api_checkpoint",
                job=report.job,
                rank=report.rank,
                step=report.step,
                level=report.level,
                ok=event.data.get("ok"),
                reason=event.data.get("reason") or None,
            )
            self._emit(event)
            for deleted in await self.verified_copies.gone(report.job, report.rank, report.level):
                self.counters["checkpoints_deleted"] = self.counters.get("checkpoints_deleted", 0) + 1
                log.info(
                    "local_api_checkpoint_deleted",
                    job=report.job,
                    rank=report.rank,
                    step=deleted.data.get("step"),
                    level=report.level,
                )
                self._emit(deleted)

        self._verification(check(), "ftd-localapi-checkpoint")

    def _ack(self, conn: Conn, msg: wire.AckMsg) -> None:
        assert conn.job is not None
        target = self._pending.job_of(msg.directive_id, conn.job)  # unknown here: the coordinator checks
        if target is not None and target != conn.job:
            self.counters["acks_refused"] += 1
            log.warning(
                "ack_refused",
                directive_id=msg.directive_id,
                directive_job=target,
                job=conn.job,
                rank=conn.rank,
                pid=conn.pid,
            )
            self._send(
                conn,
                wire.error_line(
                    protocol.ACK, f"directive {msg.directive_id} is not for job {conn.job}"[:500]
                ),
            )
            return
        self.counters["acks"] += 1
        self._pending.answered(msg.directive_id, conn.job, conn.rank)
        if msg.ok and names_manifest(msg.path):  # counts only once its files verified (issue #34)
            self._verify_then_relay(conn, msg)
            return
        self._relay_ack(conn, msg)

    def _verify_then_relay(self, conn: Conn, msg: wire.AckMsg) -> None:
        assert conn.job is not None and conn.rank is not None and msg.path is not None
        if self._verifying >= MAX_VERIFY_BACKLOG:  # never queued unbounded; the save counts as failed
            self.counters["acks_unverified"] = self.counters.get("acks_unverified", 0) + 1
            why = f"not verified: {MAX_VERIFY_BACKLOG} checkpoints already being verified on this node"
            self._relay_ack(conn, msg, ok=False, reason=why)
            return
        step = msg.step if msg.step is not None else -1
        report = self._report(conn, step, msg.path, "", msg.directive_id)  # level, step -1: not compared

        async def check() -> None:
            why = await verify_ack(report)
            if why:
                self.counters["acks_unverified"] = self.counters.get("acks_unverified", 0) + 1
                log.warning("save_ack_unverified", job=report.job, rank=report.rank, why=why[:300])
                self._relay_ack(conn, msg, ok=False, reason=f"the checkpoint did not verify: {why}"[:500])
            else:
                self._relay_ack(conn, msg)

        self._verification(check(), "ftd-localapi-ack-verify")

    def _verification(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run one manifest's verification as a task, counted in the backlog until it ends."""
        self._verifying += 1

        def done(task: asyncio.Task[None]) -> None:
            self._verifying -= 1
            self._hook_tasks.discard(task)

        task = asyncio.create_task(work, name=name)
        self._hook_tasks.add(task)
        task.add_done_callback(done)

    def _relay_ack(
        self, conn: Conn, msg: wire.AckMsg, *, ok: bool | None = None, reason: str | None = None
    ) -> None:
        assert conn.job is not None and conn.rank is not None
        ack = Ack(
            directive_id=msg.directive_id,
            job=conn.job,
            rank=conn.rank,
            node=self.node,
            ok=msg.ok if ok is None else ok,
            step=msg.step,
            path=msg.path,
            reason=msg.reason if reason is None else reason,
            ts=time.time(),
        )
        log.info(
            "local_api_ack",
            directive_id=ack.directive_id,
            job=ack.job,
            rank=ack.rank,
            ok=ack.ok,
            step=ack.step,
        )
        self._calls.put(lambda: self._on_ack(ack))

    def _send(self, conn: Conn, line: bytes) -> bool:
        transport = conn.writer.transport
        if transport.is_closing():
            return False
        if transport.get_write_buffer_size() > MAX_WRITE_BUFFER:
            self.counters["slow_clients_dropped"] += 1
            log.warning("local_api_slow_client_dropped", job=conn.job, rank=conn.rank)
            transport.abort()
            return False
        conn.writer.write(line)
        return True

    def _bad(self, conn: Conn, re: str | None, error: str) -> None:
        self.counters["bad_messages"] += 1
        conn.errors += 1
        if conn.errors <= 10 or conn.errors % 1000 == 0:
            log.warning(
                "local_api_bad_message", job=conn.job, rank=conn.rank, error=error[:200], count=conn.errors
            )
        self._send(conn, wire.error_line(re, error[:500]))

    # --- callbacks ---------------------------------------------------------------------------
