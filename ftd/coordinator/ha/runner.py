"""Active/standby coordinators (``coordinator.ha.ledger = "postgresql"``): wait, lead, step down.

:class:`HaRunner` is what ``ftd coordinator`` runs with a PostgreSQL ledger. Every replica runs it:

* **Standby**: the process is up (config checked, plugins importable, the database reachable), polls
  the lease every ``poll_interval_s`` and serves a read-only status (:class:`HaStatus`, in the log and
  through :meth:`HaStatus.as_dict`) -- but holds **no coordinator session** (only the read-only
  :class:`RetainedView`, under a login of its own, closed while leading). All replicas share the
  coordinator's persistent MQTT session (one client id): the broker queues what arrives while no one
  leads and delivers it to whoever connects next, and a new leader's connection takes the session
  over from a frozen old one (the broker drops the old connection). A standby with a session of its
  own would steal it, or need one of its own whose queue no one drains.
* **Takeover**: on winning the lease (epoch ``n``) it builds a fresh :class:`Coordinator` on the
  shared ledger with its writes fenced to epoch ``n`` (:class:`~ftd.coordinator.ledger.postgres.PgLedger`),
  the bus, the scheduler and every executor guarded by the lease (:mod:`ftd.coordinator.ha.lease`), and
  runs it: the engine rebuilds its memory from the ledger, the coordinator handles the retained
  status and presence and the queued messages, then resumes the unfinished actions and plans --
  once: only the holder of the new epoch does it, and the old holder can no longer write.
  Agents re-send every event not yet receipted when the new leader's ``online`` status arrives, so
  no event is lost across the gap.
* **Leading**: a task renews the lease every ``renew_interval_s``. A renewal that finds the term
  over, or a local deadline passed without a successful renewal (the database unreachable, the
  process frozen), ends the term: the coordinator is **stepped down** without a word to anyone --
  its tasks cancelled, its bus stopped (no ``offline`` status: the new leader's ``online`` is the
  truth), its ledger closed -- and the replica goes back to standby.
* **Database down**: the leader cannot renew, so at its local deadline it steps down; no one can
  take the lease while the database is down, so nothing acts (fail safe, never two active); agents
  keep spooling events. When the database returns, one replica wins the lease and goes on.
* **The coordinator fails** (an error out of its run, such as the database going away during a
  start-up read) **or a ledger write fails** (the database unreachable for a moment, shorter than the
  lease): stepped down as above, the term released when still held, back to standby; the next term
  (this replica's or another's) rebuilds from the ledger, gets the unacknowledged messages again
  and resumes what was cut short. Without this, a message the ledger could not take would wait
  for the next reconnect, and an action whose last write failed would stay "running" in the ledger
  until the next takeover.
* **Clean stop** (SIGTERM): the leader closes its coordinator (``offline`` status) and releases the
  lease, so a standby takes over at its next poll instead of after the TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from ftd.bus.base import Bus, Message
from ftd.config import Config
from ftd.config.credentials import standby_bus
from ftd.coordinator.actions.scheduler import Scheduler
from ftd.coordinator.ha.lease import FencedBus, FencedScheduler, Lease, guard_executors
from ftd.coordinator.ha.standby_api import StandbyApi
from ftd.coordinator.ledger.postgres import PgLedger
from ftd.coordinator.ledger.store import LedgerUnavailable
from ftd.coordinator.model.leadership import HaStatus
from ftd.logs import get_logger
from ftd.sdnotify import notify, ping_watchdog

log = get_logger(__name__)


class RetainedView:
    """What a standby keeps warm: the retained node status and job presence, from a bus session of its
    own (clean, a client id of its own and a read-only login of its own,
    ``coordinator.ha.standby_username``: it never touches the coordinator's persistent session; see
    :func:`view_bus_maker`). Open only while this replica stands by: a leader has no use for it, and
    replicas that share one standby login would otherwise replace each other's view at the broker.

    Why: the new leader's persistent session delivers the messages queued while no one led *before*
    the broker re-sends the retained status and presence on its new subscriptions; decided without
    them, an Xid on a job's node would find no job there. The leader replays this snapshot through
    its handlers before it starts (:meth:`Coordinator.handle`, placement checks included)."""

    def __init__(self, make_bus: Callable[[], Bus]) -> None:
        self.make_bus = make_bus  # a fresh session each time the replica stands by
        self.bus: Bus | None = None
        self.retained: dict[str, Message] = {}  # topic -> its last retained message
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Open the session (no-op while open); the broker re-sends what is retained now."""
        from ftd.bus import topics

        if self.bus is not None:
            return
        self.retained.clear()  # what was cleared while this replica led is not re-sent
        self.bus = self.make_bus()
        for pattern in (topics.ALL_NODE_STATUS, topics.ALL_NODE_JOBS):
            await self.bus.subscribe(pattern)
        await self.bus.start()
        self._task = asyncio.create_task(self._pump(self.bus), name="standby-retained")

    async def _pump(self, bus: Bus) -> None:
        async for message in bus.messages():
            if not message.payload:
                self.retained.pop(message.topic, None)
            else:
                self.retained[message.topic] = message

    def snapshot(self) -> list[Message]:
        """Node status first (presence may name nodes), then presence."""
        messages = list(self.retained.values())
        return sorted(messages, key=lambda m: (not m.topic.endswith("/status"), m.topic))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        bus, self.bus = self.bus, None
        if bus is not None:
            await bus.stop()


def view_bus_maker(config: Config) -> Callable[[str], Bus] | None:
    """``make_view_bus`` for :class:`HaRunner` from ``config``: the MQTT bus with the standby's login
    (:func:`~ftd.config.credentials.standby_bus`), or None -- logged once as
    ``standby_view_disabled`` with the reason and what to set -- where the view would log in as the
    coordinator and, under ``use_username_as_clientid``, close the leader's persistent session."""
    standby, why_not = standby_bus(config)
    if standby is None:
        log.warning(
            "standby_view_disabled", reason=why_not, consequence="a takeover waits for retained status"
        )
        return None
    from ftd.bus.factory import make_mqtt_bus  # the only paho importer: loaded when used

    login = standby
    return lambda client_id: make_mqtt_bus(login, client_id=client_id, clean_session=True)


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class HaRunner:
    """One replica: standby until it wins the lease, then the coordinator until it loses it."""

    def __init__(
        self,
        config: Config,
        *,
        make_bus: Callable[[], Bus],
        scheduler: Scheduler | None,
        extra_plugins: tuple[object, ...] = (),
        on_coordinator: Callable[[Any], None] | None = None,
        make_view_bus: Callable[[str], Bus] | None = None,
    ) -> None:
        """``make_bus`` makes the coordinator's bus (its persistent session) for each term;
        ``make_view_bus(client_id)`` the standby's clean session for the :class:`RetainedView`
        (None: no warm view; the leader then waits for the retained messages like a restart)."""
        ha = config.coordinator.ha
        if ha.ledger != "postgresql" or not ha.dsn:
            raise ValueError("coordinator.ha: ledger = postgresql with a dsn is needed for active/standby")
        self.config = config
        self.dsn = ha.dsn
        self.make_bus = make_bus
        self.scheduler = scheduler
        self.extra_plugins = extra_plugins
        self.on_coordinator = on_coordinator  # called with each new leader's Coordinator (benches, tests)
        self.lease = Lease(
            ha.dsn,
            ha.identity or default_identity(),
            ttl_s=ha.lease_ttl_s,
            renew_s=ha.renew_interval_s,
            timeout_s=min(ha.statement_timeout_s, ha.lease_ttl_s / 5),
        )
        self.poll_s = ha.poll_interval_s
        self.status = HaStatus(identity=self.lease.identity)
        self.coordinator: Any = None
        self.view: RetainedView | None = None
        if make_view_bus is not None:
            client_id, make = f"ftd-standby-{self.lease.identity}", make_view_bus
            self.view = RetainedView(lambda: make(client_id))
        self.api: StandbyApi | None = None
        if config.coordinator.api.enabled:
            dsn, timeout = ha.dsn, ha.statement_timeout_s
            self.api = StandbyApi(
                config.coordinator.api, self.status, lambda: PgLedger(dsn, timeout_s=timeout)
            )

    async def _refresh(self) -> None:
        try:
            info = await self.lease.info()
        except LedgerUnavailable:
            self.status.database_ok = False
            return
        self.status.database_ok = True
        self.status.leader, self.status.leader_epoch = info.holder, info.epoch
        self.status.lease_age_s, self.status.lease_expires_in_s = info.age_s, info.expires_in_s

    async def run(self, ready: Callable[[], None] | None = None) -> None:
        """Standby, lead, step down, standby ... until cancelled."""
        if ready is not None:
            ready()  # the replica is up; whether it leads is the lease's business
        notify("READY=1")  # systemd (Type=notify): a standby is a started service too
        watchdog = asyncio.create_task(ping_watchdog(), name="watchdog")
        log.info("ha_standby", identity=self.lease.identity, ttl_s=self.lease.ttl_s)
        try:
            while True:
                if self.view is not None:
                    await self.view.start()  # standing by (again): keep the retained state warm
                if self.api is not None:
                    await self.api.start()
                await self._wait_for_lease()
                if self.api is not None:
                    await self.api.stop()  # the leader's full API takes the port
                await self._lead()
        finally:
            if self.api is not None:
                await self.api.stop()
            watchdog.cancel()
            if self.view is not None:
                await self.view.stop()
            await self.lease.close()

    async def _wait_for_lease(self) -> None:
        last_report = 0.0
        while True:
            try:
                if await self.lease.try_acquire():
                    return
                self.status.database_ok = True
            except LedgerUnavailable as exc:
                if self.status.database_ok:
                    log.warning("ha_database_unavailable", error=str(exc))
                self.status.database_ok = False
            if time.monotonic() - last_report > 1:
                await self._refresh()
                last_report = time.monotonic()
            await asyncio.sleep(self.poll_s)

    async def _lead(self) -> None:
        from ftd.coordinator.wiring import build

        epoch = self.lease.check()
        status = self.status
        status.role, status.epoch, status.terms = "leader", epoch, status.terms + 1
        status.leader, status.leader_epoch, status.database_ok = self.lease.identity, epoch, True
        status.takeovers.append(time.time())
        ha = self.config.coordinator.ha
        check = self.lease.check
        # Nothing is read here: the ledger connects, and the coordinator reads its memory, in _run,
        # where a database failure ends the term like any other failure of the running coordinator.
        ledger = PgLedger(self.dsn, timeout_s=ha.statement_timeout_s)
        ledger.epoch = epoch
        bus = FencedBus(self.make_bus(), check)
        scheduler = FencedScheduler(self.scheduler, check) if self.scheduler is not None else None
        coordinator = build(
            self.config, bus=bus, scheduler=scheduler, ledger=ledger, extra_plugins=self.extra_plugins
        )
        coordinator.engine.executors = guard_executors(coordinator.engine.executors, check)
        coordinator.ha = status  # the API, /metrics and ftd status show who leads
        self.coordinator = coordinator
        if self.on_coordinator is not None:
            self.on_coordinator(coordinator)
        log.info("ha_leading", identity=self.lease.identity, epoch=epoch)
        running = asyncio.create_task(self._run(coordinator), name="coordinator")
        keeper = asyncio.create_task(self._keep(ledger), name="lease")
        clean = failed = False
        try:
            done, _ = await asyncio.wait({running, keeper}, return_when=asyncio.FIRST_COMPLETED)
            if running in done:
                error = running.exception()
                if error is None:
                    clean = True
                else:  # e.g. the database went away under a start-up read: hand over, stand by
                    failed = True
                    log.error(
                        "ha_coordinator_failed",
                        identity=self.lease.identity,
                        epoch=epoch,
                        error=f"{type(error).__name__}: {error}",
                    )
            elif keeper.result():
                failed = True  # a ledger write failed: end the term (released if still held)
        except asyncio.CancelledError:
            clean = True  # a stop asked for (SIGTERM): close properly and hand the lease over
            raise
        finally:
            keeper.cancel()
            running.cancel()
            await asyncio.gather(running, keeper, return_exceptions=True)
            if clean and self.lease.held:
                with contextlib.suppress(Exception):
                    await coordinator.close()
                await self.lease.release()
            else:
                held = failed and self.lease.held
                await self._step_down(coordinator)
                if held:  # the term is still ours: end it, so another replica need not wait the TTL
                    self.lease.epoch = epoch
                    await self.lease.release()
            status.role, status.epoch = "standby", None
            self.coordinator = None
        if failed:
            await asyncio.sleep(self.poll_s)

    async def _run(self, coordinator: Any) -> None:
        """The ledger's memory (a failure here ends the term: the database went away), the warm view's
        retained status and presence, then the coordinator itself."""
        await coordinator.load()
        if self.view is not None:
            snapshot = self.view.snapshot()
            await self.view.stop()  # leading: reopened when this replica stands by again
            if snapshot:
                await coordinator.placement.warm()
                for message in snapshot:
                    await coordinator.handle(message)
                log.info("ha_state_warmed", messages=len(snapshot), jobs=len(coordinator.state.jobs))
        await coordinator.run()

    async def _keep(self, ledger: PgLedger) -> bool:
        """Renew until the term is over: False then; True when it must end because a ledger write
        failed (the database was unreachable for a moment): what the engine holds in memory (an
        action it counts as ended, a message it could not record) may then differ from the ledger,
        and the next term -- this replica's or another's -- rebuilds from the ledger and resumes."""
        while True:
            await asyncio.sleep(self.lease.renew_s)
            if ledger.write_failures:
                log.warning("ha_ledger_write_failed", epoch=self.lease.epoch, failures=ledger.write_failures)
                return True
            try:
                if not await self.lease.renew():
                    return False
                await self._refresh()
            except LedgerUnavailable as exc:
                log.warning("lease_renew_failed", epoch=self.lease.epoch, error=str(exc))
                if not self.lease.held:
                    self.lease.epoch = None
                    return False

    async def _step_down(self, coordinator: Any) -> None:
        """End a lost term without acting: no status, no ledger write, no acknowledgement."""
        log.warning("ha_stepping_down", identity=self.lease.identity, epoch=self.status.epoch)
        self.lease.epoch = None  # every guard refuses from here on
        api = getattr(coordinator, "api", None)
        with contextlib.suppress(Exception):
            if api is not None:
                await api.stop()
        with contextlib.suppress(Exception):
            await coordinator.engine.close()
        with contextlib.suppress(Exception):
            await coordinator.placement.close()
        with contextlib.suppress(Exception):
            await coordinator.bus.stop()
        with contextlib.suppress(Exception):
            await coordinator.ledger.close()
