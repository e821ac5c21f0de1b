"""The agent's pair-test service: the server run as a supervised watcher, and when this node is busy.

What: :class:`PairTestService` (name ``pair_tests``) reads the fleet's pair-test key from
``agent.pair_tests.key_file`` and runs a :class:`~ftd.agent.pair_tests.server.PairTestServer` on
``agent.pair_tests.port`` until the agent stops. Disabled, or with no key file configured, it is
``idle`` with the reason; a key file named but unreadable or empty is ``unavailable`` with the reason
(the agent's metrics and ``agent_health`` show it). No test is ever answered without the key. :func:`training`
is the ``busy`` check both the server and the client use: a node with ranks registered through the
client or a job its scheduler's Prolog reported is training, and takes part in no test.

Why a watcher: the agent already supervises watchers (restart with backoff, health); the server is
one more long-running task with nothing else to share.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from ftd.agent.pair_tests.allreduce import AllReduceStep
from ftd.agent.pair_tests.client import PairPeer, run_pair_test
from ftd.agent.pair_tests.server import Busy, PairTestServer
from ftd.agent.watchers.base import WatcherHealth
from ftd.config.credentials import read_secret_file
from ftd.config.errors import ConfigError
from ftd.config.schema import PairTestsConfig
from ftd.events import NODE_RANK, Ack, Directive, Event, Kind, Severity, SupervisorInfo, make_event
from ftd.fabric.pairs import PairResult
from ftd.logs import get_logger

__all__ = ["NO_RANKS", "PairTestService", "read_key", "result_event", "training", "training_jobs"]

log = get_logger(__name__)


def read_key(path: str) -> tuple[bytes | None, str]:
    """The key in ``path`` (a secret file like the others: a relative name is a systemd credential),
    or ``None`` and why not."""
    if not path:
        return None, "agent.pair_tests.key_file is not set"
    try:
        key = read_secret_file(path, "agent.pair_tests.key_file").strip()
    except ConfigError as exc:
        return None, "; ".join(p.message for p in exc.problems)
    if not key:
        return None, f"{path} is empty"
    return key.encode(), ""


#: A rank supervisor (``ftd run``) in one of these states runs no rank here: a hot spare waiting, or a
#: slot between two generations (its ranks stopped, exited or never started). ``lost`` is not one:
#: its ranks may outlive it.
NO_RANKS = frozenset({"idle", "stopped", "exited", "failed"})


def training_jobs(
    ranks: Mapping[str, Any],
    scheduler_jobs: Mapping[str, Any],
    supervisors: Mapping[str, SupervisorInfo] | None = None,
) -> list[str]:
    """The jobs training on this node: every job with a rank registered through the client, and every
    job the scheduler's Prolog reported here -- unless this node's rank supervisor of that job says
    it runs no rank now (:data:`NO_RANKS`: a hot spare, or the slots of a job stopped for a restart),
    which is what lets a spare be tested against the nodes of the job it would join while that job is
    stopped (issue #35). A scheduler job with no supervisor here counts as training: what it runs is
    not known."""
    idle = {job for job, info in (supervisors or {}).items() if info.state in NO_RANKS}
    return sorted({*ranks, *(job for job in scheduler_jobs if job not in idle)})


def training(
    ranks: Callable[[], Mapping[str, Any]],
    scheduler_jobs: Callable[[], Mapping[str, Any]],
    supervisors: Callable[[], Mapping[str, SupervisorInfo]] | None = None,
) -> Busy:
    """``busy`` for this node: why it trains (the jobs, :func:`training_jobs`), or ``None``."""

    def busy() -> str | None:
        jobs = training_jobs(ranks(), scheduler_jobs(), supervisors() if supervisors is not None else None)
        return f"training (job {', '.join(jobs)})" if jobs else None

    return busy


class PairTestService:
    name = "pair_tests"

    def __init__(self, cfg: PairTestsConfig, node: str, *, busy: Busy, host: str = "0.0.0.0") -> None:
        self.cfg = cfg
        self.node = node
        self.busy = busy
        self.host = host
        self.server: PairTestServer | None = None
        self.listening = asyncio.Event()  # set once the server accepts tests
        self._health = (
            WatcherHealth("idle", "pair tests disabled") if not cfg.enabled else WatcherHealth("running")
        )

    def health(self) -> WatcherHealth:
        return self._health

    async def run(self) -> None:
        if not self.cfg.enabled:
            await asyncio.Event().wait()
        key, why = read_key(self.cfg.key_file)
        if key is None:
            # not configured is not broken (idle); a key file named and unreadable is (unavailable)
            reason = f"no pair-test key: {why}; pair tests skipped"
            self._health = WatcherHealth("unavailable" if self.cfg.key_file else "idle", reason)
            log.warning("pair_tests_not_served", why=why)
            await asyncio.Event().wait()
            return
        self.server = PairTestServer(
            node=self.node,
            key=key,
            host=self.host,
            port=self.cfg.port,
            max_bytes=self.cfg.max_bytes,
            max_seconds=self.cfg.timeout_s,
            busy=self.busy,
            allreduce=self.allreduce_step(self.cfg.allreduce_bytes),
        )
        await self.server.start()
        self._health = WatcherHealth("running")
        self.listening.set()
        try:
            await asyncio.Event().wait()
        finally:
            self.listening.clear()
            await self.server.close()

    def allreduce_step(self, wanted: object) -> AllReduceStep | None:
        """The all-reduce step of a test (``wanted`` bytes, capped by this agent's config), or None
        when it is off here or the directive asked for none."""
        limit = self.cfg.allreduce_bytes
        nbytes = wanted if isinstance(wanted, int) and not isinstance(wanted, bool) else limit
        nbytes = max(0, min(nbytes, limit))
        if nbytes <= 0:
            return None
        return AllReduceStep(
            max_bytes=nbytes, timeout_s=self.cfg.allreduce_timeout_s, python=self.cfg.allreduce_python
        )

    async def on_directive(self, directive: Directive) -> tuple[Event, Ack]:
        """Run the pair test a ``pair_test`` directive asks (``params``: ``peer``, ``host``, ``port``,
        optional ``max_bytes``/``timeout_s``, each capped by this agent's config) and answer with its
        ``pair_test`` event and an Ack carrying the result. Disabled, keyless, training or a malformed
        directive: the result's error says why; nothing is measured."""
        params = directive.params
        result = await self.test(
            params.get("peer"),
            params.get("host"),
            params.get("port", self.cfg.port),
            params.get("max_bytes", self.cfg.max_bytes),
            params.get("timeout_s", self.cfg.timeout_s),
            params.get("allreduce_bytes", self.cfg.allreduce_bytes),
        )
        event = result_event(self.node, result, directive)
        ack = Ack(
            directive_id=directive.id,
            job=directive.job or "",
            rank=NODE_RANK,
            node=self.node,
            ok=not result.error,
            reason=result.error,
            ts=time.time(),
            data={"pair_test": result.as_dict()},
        )
        return event, ack

    async def test(
        self,
        peer: object,
        host: object,
        port: object,
        wanted: object,
        timeout: object,
        allreduce_bytes: object = None,
    ) -> PairResult:
        """One pair test against ``peer`` at ``host``:``port`` (as a directive or a burn-in names it),
        ``wanted`` bytes and ``timeout`` seconds each capped by this agent's config, and the all-reduce
        step of ``allreduce_bytes`` (None: the config's; 0: none). Disabled, keyless, training or
        malformed: the result's error says why; nothing is measured."""
        key, why = read_key(self.cfg.key_file)
        if not self.cfg.enabled:
            result = PairResult(a=self.node, b=str(peer or ""), error="pair tests disabled on this node")
        elif key is None:
            result = PairResult(a=self.node, b=str(peer or ""), error=f"no pair-test key: {why}")
        elif (
            not isinstance(peer, str)
            or not isinstance(host, str)
            or not isinstance(port, int)
            or not isinstance(wanted, int)
            or not isinstance(timeout, int | float)
            or isinstance(port, bool)
        ):
            result = PairResult(a=self.node, b=str(peer or ""), error="malformed pair_test directive")
        else:
            result = await run_pair_test(
                PairPeer(node=peer, host=host, port=port),
                node=self.node,
                key=key,
                max_bytes=max(0, min(wanted, self.cfg.max_bytes)),
                timeout_s=max(0.1, min(float(timeout), self.cfg.timeout_s)),
                pings=self.cfg.pings,
                busy=self.busy,
                allreduce=self.allreduce_step(allreduce_bytes),
            )
        return result


def result_event(node: str, result: PairResult, directive: Directive | None = None) -> Event:
    """A pair test's ``pair_test`` event: the result's fields (docs/signals.md), INFO or WARNING."""
    data = result.as_dict()
    if directive is not None:
        data["directive_id"] = directive.id
        data["action_id"] = directive.action_id
    return make_event(
        node,
        Kind.PAIR_TEST,
        severity=Severity.WARNING if result.error else Severity.INFO,
        source="pair_tests",
        data=data,
    )
