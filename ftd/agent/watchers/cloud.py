"""Cloud interruption notices (issue #37): poll the instance metadata servers, publish each notice once.

What: every ``interval_s`` each enabled provider's endpoints are read over loopback-style HTTP
(aiohttp, one session): AWS IMDSv2 (a session token by PUT, then ``spot/instance-action`` and
``events/recommendations/rebalance``), GCP (``instance/preempted`` and ``instance/maintenance-event``
with ``Metadata-Flavor: Google``), Azure Scheduled Events (``Metadata: true``). The bodies go to the
pure parsers of :mod:`ftd.agent.watchers.cloud_notices`; each new notice (by source and ``ref``)
becomes one :attr:`~ftd.events.Kind.INTERRUPTION` event whose data is the
:class:`~ftd.events.Interruption` as a dict. A notice seen again is not published again.

Why this shape: a metadata server that hangs or refuses must never stall the agent, nor be
hammered. Every request has a total deadline (``timeout_s``); a body is read only up to
``max_body_bytes``; an endpoint that errs (timeout, connection refused, 5xx, a refused body) waits a
doubling delay (up to ``backoff_max_s``) before its next try and counts the error by reason
(``polls`` / ``errors`` feed ``/metrics``). A 404 is "no notice" (AWS's way of saying none).

An urgent notice (a spot reclaim, a GCP preemption, an Azure ``Preempt`` or ``Terminate``) also
writes its deadline to ``deadline`` beside the agent's socket: the node's trainer clients and
``ftd run`` read it when their SIGTERM comes (the machine's shutdown), so they save only if the save
can land before it and give their ranks the time left (:mod:`ftd.client.deadline`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import msgspec

from ftd.agent.watchers.base import Emit, WatcherHealth
from ftd.agent.watchers.cloud_notices import (
    Limits,
    Parsed,
    parse_aws_rebalance,
    parse_aws_spot,
    parse_azure_scheduled,
    parse_gcp_maintenance,
    parse_gcp_preempted,
)
from ftd.config import CloudConfig
from ftd.events import Interruption, Kind, Severity, make_event
from ftd.fileio import write_atomic
from ftd.logs import get_logger

__all__ = ["CloudWatcher", "Endpoint"]

log = get_logger(__name__)

AWS_TOKEN_TTL_S = 300
_SEEN_MAX = 256  # notices remembered (a notice appears once or a few times in an instance's life)
_URGENT = {"aws_spot", "gcp_preempt"}
_AZURE_URGENT = {"Preempt", "Terminate"}

Parser = Callable[[bytes, float], Parsed]


class _Refused(Exception):
    """A request that did not give a usable answer; ``reason`` is the error count's label."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass(slots=True)
class Endpoint:
    """One polled URL: its provider, the headers it wants, its parser and its backoff state."""

    provider: str
    name: str
    url: str
    headers: dict[str, str]
    parse: Parser
    failures: int = 0
    next_at: float = 0.0  # monotonic time before which it is not polled (backoff)


@dataclass(slots=True)
class _Counts:
    polls: collections.Counter[str] = field(default_factory=collections.Counter)
    errors: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    notices: collections.Counter[str] = field(default_factory=collections.Counter)


class CloudWatcher:
    """Polls the enabled providers' metadata endpoints and emits each new notice once."""

    name = "cloud"

    def __init__(
        self,
        cfg: CloudConfig,
        node: str,
        emit: Emit,
        *,
        clock: Callable[[], float] = time.time,
        deadline_file: Path | None = None,
    ) -> None:
        self.cfg, self.node, self.emit, self.clock = cfg, node, emit, clock
        # Where an urgent notice's deadline is written for the node's processes (the trainer client
        # and ftd run read it at their SIGTERM: ftd.client.deadline); None: not written.
        self.deadline_file = deadline_file
        self.limits = Limits(
            max_body=cfg.max_body_bytes,
            past_slack_s=cfg.past_slack_s,
            max_ahead_s=cfg.max_ahead_s,
            rebalance_horizon_s=cfg.aws_rebalance_horizon_s,
        )
        self.endpoints = self._endpoints()
        self.counts = _Counts()
        self.last_progress = 0.0
        # (endpoint url, source, ref) of the notices published and still announced
        self._seen: collections.OrderedDict[tuple[str, str, str], None] = collections.OrderedDict()
        self._aws_token: tuple[str, float] | None = None  # token, monotonic expiry
        self._token_lock = asyncio.Lock()  # the two AWS endpoints polled together share one PUT

    def _endpoints(self) -> list[Endpoint]:
        cfg, limits = self.cfg, self.limits
        found: list[Endpoint] = []
        if cfg.aws:
            base = cfg.aws_url + "/latest/meta-data"
            found += [
                Endpoint(
                    "aws",
                    "spot",
                    base + "/spot/instance-action",
                    {},
                    lambda b, t: parse_aws_spot(b, t, limits),
                ),
                Endpoint(
                    "aws",
                    "rebalance",
                    base + "/events/recommendations/rebalance",
                    {},
                    lambda b, t: parse_aws_rebalance(b, t, limits),
                ),
            ]
        if cfg.gcp:
            base, flavor = cfg.gcp_url + "/computeMetadata/v1/instance", {"Metadata-Flavor": "Google"}
            found += [
                Endpoint(
                    "gcp",
                    "preempted",
                    base + "/preempted",
                    flavor,
                    lambda b, t: parse_gcp_preempted(b, t, limits),
                ),
                Endpoint(
                    "gcp",
                    "maintenance",
                    base + "/maintenance-event",
                    flavor,
                    lambda b, t: parse_gcp_maintenance(b, t, limits),
                ),
            ]
        if cfg.azure:
            resource = cfg.azure_resource or self.node
            found.append(
                Endpoint(
                    "azure",
                    "scheduled",
                    cfg.azure_url + "/metadata/scheduledevents?api-version=2020-07-01",
                    {"Metadata": "true"},
                    lambda b, t: parse_azure_scheduled(b, t, limits, resource=resource),
                )
            )
        return found

    def health(self) -> WatcherHealth:
        if not self.endpoints:
            return WatcherHealth("idle", "no cloud provider enabled")
        down = [e.provider + "/" + e.name for e in self.endpoints if e.failures >= 3]
        if down and len(down) == len(self.endpoints):
            return WatcherHealth("unavailable", "metadata server not answering: " + ", ".join(down))
        return WatcherHealth("running")

    async def run(self) -> None:
        if not self.endpoints:
            log.info("cloud_notices_disabled")
            await asyncio.Event().wait()  # nothing enabled: idle until cancelled, never poll
        timeout = aiohttp.ClientTimeout(total=self.cfg.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout, trust_env=False) as session:
            log.info("cloud_notices_polling", endpoints=[e.url for e in self.endpoints])
            while True:
                self.last_progress = time.monotonic()
                await self.poll_once(session)
                await asyncio.sleep(self.cfg.interval_s)

    async def poll_once(self, session: aiohttp.ClientSession) -> None:
        """One pass: every endpoint not backing off, concurrently (each bounded by ``timeout_s``)."""
        now = time.monotonic()
        due = [e for e in self.endpoints if e.next_at <= now]
        await asyncio.gather(*(self._poll(session, e) for e in due))

    async def _poll(self, session: aiohttp.ClientSession, endpoint: Endpoint) -> None:
        self.counts.polls[endpoint.provider] += 1
        try:
            body = await self._fetch(session, endpoint)
        except _Refused as exc:
            self._failed(endpoint, exc.reason, exc.detail)
            return
        parsed = Parsed() if body is None else endpoint.parse(body, self.clock())
        if parsed.error:  # a refused notice: counted and backed off like a failing endpoint
            self._failed(endpoint, parsed.error, parsed.detail)
        else:
            endpoint.failures, endpoint.next_at = 0, 0.0
            if not parsed.notices:  # the endpoint says "none" again: a later notice is a new one
                self._forget(endpoint)
        for notice in parsed.notices:  # the sane ones of a document that also held a bogus one
            await self._publish(endpoint, notice)

    async def _fetch(self, session: aiohttp.ClientSession, endpoint: Endpoint) -> bytes | None:
        """The body, ``None`` for 404 (no notice); raises :class:`_Refused` for everything else."""
        headers = dict(endpoint.headers)
        if endpoint.provider == "aws":
            headers["X-aws-ec2-metadata-token"] = await self._token(session)
        try:
            async with session.get(endpoint.url, headers=headers, allow_redirects=False) as resp:
                if resp.status == 404:
                    return None
                if resp.status == 401 and endpoint.provider == "aws":
                    self._aws_token = None  # expired or revoked: a new one next time
                if resp.status != 200:
                    raise _Refused(f"http_{resp.status // 100}xx", f"HTTP {resp.status}")
                return await self._read(resp)
        except TimeoutError:
            raise _Refused("timeout", f"no answer within {self.cfg.timeout_s:g} s") from None
        except aiohttp.ClientError as exc:
            raise _Refused("unreachable", str(exc)[:200]) from None

    async def _read(self, resp: aiohttp.ClientResponse) -> bytes:
        limit = self.cfg.max_body_bytes
        if resp.content_length is not None and resp.content_length > limit:
            raise _Refused("too_large", f"Content-Length {resp.content_length}")
        chunks: list[bytes] = []
        size = 0
        async for chunk in resp.content.iter_chunked(16384):
            size += len(chunk)
            if size > limit:
                raise _Refused("too_large", f"over {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def _token(self, session: aiohttp.ClientSession) -> str:
        """The IMDSv2 session token (PUT /latest/api/token), reused until shortly before it expires."""
        async with self._token_lock:
            return await self._token_locked(session)

    async def _token_locked(self, session: aiohttp.ClientSession) -> str:
        now = time.monotonic()
        if self._aws_token is not None and self._aws_token[1] > now:
            return self._aws_token[0]
        url = self.cfg.aws_url + "/latest/api/token"
        try:
            async with session.put(
                url,
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(AWS_TOKEN_TTL_S)},
                allow_redirects=False,
            ) as resp:
                if resp.status != 200:
                    raise _Refused("token", f"token HTTP {resp.status}")
                token = (await self._read(resp)).decode("ascii", "replace").strip()
        except TimeoutError:
            raise _Refused("timeout", "token request timed out") from None
        except aiohttp.ClientError as exc:
            raise _Refused("unreachable", str(exc)[:200]) from None
        if not token or len(token) > 1024:
            raise _Refused("token", "empty or oversized token")
        self._aws_token = (token, now + AWS_TOKEN_TTL_S - 30)
        return token

    def _failed(self, endpoint: Endpoint, reason: str, detail: str) -> None:
        self.counts.errors[(endpoint.provider, reason)] += 1
        endpoint.failures += 1
        wait = min(self.cfg.backoff_max_s, self.cfg.interval_s * 2 ** min(endpoint.failures, 16))
        endpoint.next_at = time.monotonic() + wait
        log.error(
            "cloud_notice_error",
            provider=endpoint.provider,
            endpoint=endpoint.name,
            reason=reason,
            detail=detail,
            failures=endpoint.failures,
            retry_in_s=round(wait, 1),
        )

    def _forget(self, endpoint: Endpoint) -> None:
        """GCP's maintenance-event names the same value for every maintenance: once the endpoint
        answers "none", the next appearance of a value is a new notice."""
        for key in [k for k in self._seen if k[0] == endpoint.url]:
            del self._seen[key]

    async def _publish(self, endpoint: Endpoint, notice: Interruption) -> None:
        key = (endpoint.url, notice.source, notice.ref)
        if key in self._seen:
            return
        self._seen[key] = None
        while len(self._seen) > _SEEN_MAX:
            self._seen.popitem(last=False)
        self.counts.notices[notice.source] += 1
        urgent = notice.source in _URGENT or (
            notice.source == "azure_scheduled" and notice.detail in _AZURE_URGENT
        )
        log.warning(
            "cloud_notice",
            source=notice.source,
            ref=notice.ref,
            deadline=notice.deadline,
            in_s=round(notice.deadline - notice.notice_at, 1),
            detail=notice.detail,
        )
        await self.emit(
            make_event(
                self.node,
                Kind.INTERRUPTION,
                severity=Severity.CRITICAL if urgent else Severity.WARNING,
                source=f"cloud.{endpoint.provider}",
                data=msgspec.structs.asdict(notice),
            )
        )
        if urgent and self.deadline_file is not None:
            await asyncio.to_thread(self._write_deadline, self.deadline_file, notice.deadline)

    def _write_deadline(self, path: Path, deadline: float) -> None:
        """Write ``deadline`` to ``path`` unless it holds an earlier one still ahead (the machine goes
        at the first); never raises (a node without the file only loses the hint)."""
        try:
            with contextlib.suppress(OSError, ValueError):
                held = float(path.read_text(encoding="utf-8")[:64].strip())
                if self.clock() < held <= deadline:
                    return
            write_atomic(path, f"{deadline:.3f}\n", fsync=False, mode=0o644)
            path.chmod(0o644)  # whatever the umask: the node's jobs read it
            log.info("cloud_deadline_written", path=str(path), deadline=deadline)
        except OSError as exc:
            log.warning("cloud_deadline_not_written", path=str(path), why=str(exc)[:200])
