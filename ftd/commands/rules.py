"""``ftd rules test --events FILE [--config PATH] [--json]``: what would the rules have done?
``ftd rules list [--config PATH] [--json]``: which rules would the coordinator load?

``list`` loads the plugins exactly as ``ftd coordinator --config PATH`` does (built-ins, the ``ftd``
entry-point group, ``rule_dirs`` files, the ``rules_file`` pack, minus ``disabled_rules``), offline
-- no coordinator needs to run -- and prints each one's name, source (builtin, entry_point,
rule_dir, declarative), the hooks it implements and where it comes from; then the disabled names.
``--json`` prints the object the coordinator's ``GET /v1/rules`` answers: ``{"rules": [{"name",
"source", "origin", "hooks"}], "disabled": [...]}`` (the running coordinator also lists its built-in
executors plugin, ``builtin_executors``, and any plugin its embedder added). A rule file that does
not load is an error (exit 2), as it would stop the coordinator.

What: replays a recorded event stream (JSON lines of :class:`ftd.events.Event`, as
``Ledger.export_events`` writes them; ``-`` reads stdin) through the rules and the policy gate the
coordinator would run with ``--config`` (built-ins, entry-point plugins, ``rule_dirs``,
``rules_file``, ``disabled_rules``, every ``policy`` setting), and prints each action that would have
been requested: the time and triggering event, the proposing rule, the action kind and target, and
the gate's verdict (allowed, suppressed with its reason, dry_run, awaiting_approval); then a summary
table per rule and action kind. ``--json`` prints one JSON object instead (``events``,
``actions``, ``summary``, ``bad_lines``, ``duplicates``, ``rule_errors``). Nothing is executed and
nothing is published.

Simulation: the events run through the coordinator's own engine (:mod:`ftd.coordinator.decide.replay`: the
same dedupe, rules, policy gate and ledger code) on a clock that is the events' timestamps (never
the wall clock), so cooldowns, rate limits and declarative windows behave as they would have. An
allowed action is taken to run for ``--action-s`` seconds (default 60), then finish: until then
dedupe holds its key, afterwards the cooldown starts. An allowed ``drain_node`` marks its node
drained at once (it counts against the blast-radius budgets from then on); ``resume_node`` undoes
that. Held actions are never approved.

The cluster: drain budgets (``max_drained_fraction``, domain budgets) are computed over the real
cluster, as the live coordinator does, when the replay knows it: ``--from URL`` reads the nodes and
their labels from a running coordinator's ``/v1/nodes``, ``--from-api`` from the one ``--config``'s
``coordinator.api`` names; else the nodes of ``--config``'s ``coordinator.node_labels`` (the
inventory of failure domains). Those nodes start online and in service; nodes seen only in the events
are added. With neither, the cluster is only the nodes seen in the events, and the report says so
(a 4-node replay of a 500-node ledger would budget drains over 4 nodes).

Input: a raw kernel log (dmesg, ``dmesg -T``, ``journalctl -k``, syslog, a ``/dev/kmsg`` dump: the
file's first line is not JSON) is read through the agent's own kernel-log parser, every line, and
each record it finds is wrapped as the agent wraps it (source kmsg, node ``--node``, ``ts`` the
kernel timestamp, ``id`` ``kmsg-LINE``); the report says how many lines and events (the agent's storm
control, which folds repeats into one summary on the node, is not applied). Else JSON lines: the
ledger's export (``ftd events export``), or ``ftd parse kmsg`` output directly: a line
without the envelope's ``id``/``node``/``source`` but with the parser's ``line`` and ``kind`` is
wrapped as the agent would wrap it (``source`` kmsg, node ``--node``, default node-1; ``ts`` the
kernel timestamp when the log had one). Any other line missing ``id``, ``node``, ``ts``,
``severity`` or ``source`` gets them filled (``line-N``, ``--node``, the previous line's time,
warning, replay); the report counts such lines.

The rest of the cluster view is rebuilt from the events themselves, so it is approximate: every node
that sends an event is online, ``node_offline`` takes it offline until its next event; a rank is
placed on a node when an event carries ``data.job`` and ``data.rank``; ``node_offline``'s
``data.jobs`` places those jobs there. Retained job presence is not in the ledger's event stream, so
give placements with ``--job JOB=NODE[,NODE...]`` when rules need to know where jobs run (restarts).
A progress bar is drawn on stderr for inputs over 1 MiB when stderr is a terminal.

Why: operators should see what a new rule or a tighter budget would have done to last week's
incidents before they enable it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ftd.config import CoordinatorConfig
    from ftd.events import Event

VERDICTS = ("allowed", "suppressed", "dry_run", "awaiting_approval")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "rules", help="work with rules (what-if replays)", description="Work with ftd rules."
    )
    sub = parser.add_subparsers(dest="rules_what", metavar="ACTION")
    test = sub.add_parser(
        "test",
        help="replay recorded events through the rules and the policy gate",
        description="Replay recorded events (JSON lines) through the rules and the policy gate; "
        "print what would have happened. Nothing is executed.",
    )
    test.add_argument(
        "--events",
        required=True,
        metavar="FILE",
        help="JSON lines of events (ftd events export, ftd parse kmsg) or a raw kernel log "
        "(dmesg, journalctl -k, syslog); '-': stdin",
    )
    test.add_argument(
        "--config",
        metavar="PATH",
        help="coordinator config (rules, policy); default: built-in defaults",
    )
    test.add_argument("--json", action="store_true", help="print one JSON object")
    test.add_argument(
        "--from",
        dest="from_url",
        metavar="URL",
        help="take the cluster (nodes, labels) from a running coordinator's API (its /v1/nodes)",
    )
    test.add_argument(
        "--from-api",
        action="store_true",
        help="take the cluster from the coordinator --config's coordinator.api names",
    )
    test.add_argument("--node", default="node-1", help="node of input lines that name none (ftd parse kmsg)")
    test.add_argument(
        "--job",
        action="append",
        default=[],
        metavar="JOB=NODE[,NODE...]",
        help="place a job on nodes (repeatable); events carry no job presence",
    )
    test.add_argument(
        "--action-s", type=float, default=60.0, help="simulated duration of an allowed action (default 60)"
    )
    test.add_argument(
        "--no-entry-points", action="store_true", help="do not load plugins from the ftd entry-point group"
    )
    test.set_defaults(handler=run_test)
    listing = sub.add_parser(
        "list",
        help="list the rules the coordinator would load (name, source, hooks)",
        description="List the rule plugins the coordinator would load with this config: name, source "
        "(builtin, entry_point, rule_dir, declarative), hooks and origin. Works offline.",
    )
    listing.add_argument(
        "--config", metavar="PATH", help="coordinator config (rules); default: built-in defaults"
    )
    listing.add_argument("--json", action="store_true", help="print one JSON object (as GET /v1/rules)")
    listing.add_argument(
        "--no-entry-points", action="store_true", help="do not load plugins from the ftd entry-point group"
    )
    listing.set_defaults(handler=run_list)
    parser.set_defaults(handler=lambda _args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_usage(sys.stderr)
    print("ftd rules: try `ftd rules list` or `ftd rules test --events events.jsonl`", file=sys.stderr)
    return 2


# --- the listing -----------------------------------------------------------------------------------


def rules_listing(cfg: CoordinatorConfig, *, entry_points: bool = True) -> dict[str, Any]:
    """``{"rules": [...], "disabled": [...]}`` for the plugins ``cfg`` loads (GET /v1/rules' shape)."""
    from ftd.coordinator.decide.plugins import describe_plugins, disabled_plugins, make_plugin_manager

    pm = make_plugin_manager(
        disabled=cfg.disabled_rules,
        rule_dirs=cfg.rule_dirs,
        rules_file=cfg.rules_file,
        entry_points=entry_points,
    )
    return {"rules": [info.as_dict() for info in describe_plugins(pm)], "disabled": disabled_plugins(pm)}


def render_listing(listing: dict[str, Any], out: IO[str]) -> None:
    headers = ("name", "source", "hooks", "origin")
    rows = [(r["name"], r["source"], ",".join(r["hooks"]), r["origin"]) for r in listing["rules"]]
    table = [headers, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    for i, row in enumerate(table):
        out.write("  ".join(cell.ljust(widths[j]) for j, cell in enumerate(row)).rstrip() + "\n")
        if i == 0:
            out.write("  ".join("-" * w for w in widths) + "\n")
    out.write(f"\n{len(rows)} rule plugin(s) loaded")
    disabled = listing["disabled"]
    out.write(f"; disabled: {', '.join(disabled)}\n" if disabled else "\n")


def run_list(args: argparse.Namespace) -> int:
    from ftd.config import Config, ConfigError, load_config
    from ftd.coordinator.decide.plugins import PluginError

    try:
        config = load_config(args.config) if args.config else Config()
        listing = rules_listing(config.coordinator, entry_points=not args.no_entry_points)
    except (ConfigError, PluginError) as exc:
        print(f"ftd rules list: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(listing))
    else:
        render_listing(listing, sys.stdout)
    return 0


# --- the replay ------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One action the rules would have requested, and the gate's verdict on it."""

    ts: float
    event_id: str
    event: str  # "node kind[(code)]"
    rule: str
    kind: str
    target: str
    verdict: str  # one of VERDICTS
    policy: str  # the gate's reason ("" when allowed)
    reason: str  # the rule's reason


@dataclass
class Report:
    events: int = 0
    duplicates: int = 0
    bad_lines: list[tuple[int, str]] = field(default_factory=list)
    rule_errors: list[dict[str, str]] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    filled: int = 0  # lines completed with defaults (ftd parse kmsg output, or no id/node/ts)
    cluster: str = ""  # where the cluster's nodes came from
    input: str = ""  # "json lines" or "kernel log" (the first line says which)
    kernel_lines: int = 0  # lines of a raw kernel log read
    kernel_events: int = 0  # the events the agent's kernel-log parser found in them
    kernel_node: str = ""  # the node a kernel log's events are replayed as (--node)
    nodes: int = 0  # the cluster's size at the start (0: only the nodes seen in the events)

    def summary(self) -> list[dict[str, Any]]:
        counts: dict[tuple[str, str], Counter[str]] = {}
        for o in self.outcomes:
            counts.setdefault((o.rule, o.kind), Counter())[o.verdict] += 1
        return [
            {"rule": rule, "kind": kind, **{v: c[v] for v in VERDICTS}}
            for (rule, kind), c in sorted(counts.items())
        ]


class Replay:
    """Feeds recorded events through the coordinator's own engine in a :class:`Sandbox`.

    Adds only what a recording lacks: the cluster view (nodes online, where ranks run) is inferred
    from the events (see the module docstring) before each is handed to the engine."""

    def __init__(
        self,
        cfg: CoordinatorConfig,
        *,
        jobs: dict[str, list[str]] | None = None,
        action_s: float = 60.0,
        entry_points: bool = True,
        extra: tuple[object, ...] = (),
        nodes: Iterable[str] = (),
    ) -> None:
        from ftd.coordinator.decide.replay import Sandbox
        from ftd.coordinator.ledger.sqlite import memory_store
        from ftd.events import NodeStatus

        self.sandbox = Sandbox(
            cfg, ledger=memory_store, action_s=action_s, entry_points=entry_points, extra=extra
        )
        self.state = self.sandbox.state
        self.engine = self.sandbox.engine
        self.report = Report()
        for name in nodes:  # the real cluster: budgets are fractions of it, not of the nodes seen
            self.state.apply_status(NodeStatus(node=name, state="online", ts=0.0))
        self.report.nodes = len(self.state.nodes)
        self._current: Event | None = None
        self._outcomes: dict[str, Outcome] = {}
        self.engine.observe(self._observe)
        for job, nodes in (jobs or {}).items():
            for rank, node in enumerate(nodes):
                self._place(job, node, rank)

    def _place(self, job: str, node: str, rank: int) -> None:
        from ftd.events import JobPresence, RankInfo

        record = self.state.jobs.get(job)
        ranks = list(record.ranks_by_node.get(node, [])) if record else []
        if any(r.rank == rank for r in ranks):
            return
        ranks.append(RankInfo(rank=rank))
        self.state.apply_presence(node, job, JobPresence(job=job, node=node, ranks=ranks))
        self.state.nodes[node].online = True

    def _observe(self, what: str, payload: Any) -> None:
        from ftd.plugin.actions import ActionState

        event = self._current
        if event is None:
            return
        if what == "rule_error":
            _, rule, error = payload
            self.report.rule_errors.append({"event_id": event.id, "rule": rule, "error": error})
        elif what == "action" and payload.id not in self._outcomes:
            request = payload.request
            code = event.data.get("code")
            outcome = Outcome(
                ts=event.ts,
                event_id=event.id,
                event=f"{event.node} {event.kind}" + (f"({code})" if isinstance(code, int) else ""),
                rule=request.rule,
                kind=str(request.kind),
                target=request.target,
                verdict="allowed" if payload.state == ActionState.PENDING else str(payload.state),
                policy=str(payload.detail.get("policy", "")),
                reason=request.reason,
            )
            self._outcomes[payload.id] = outcome
            self.report.outcomes.append(outcome)

    async def feed(self, event: Event) -> None:
        from ftd.events import Kind

        await self.sandbox.clock.advance(event.ts)
        node = self.state._node(event.node)
        node.online = event.kind != Kind.NODE_OFFLINE
        job, rank = event.data.get("job"), event.data.get("rank")
        if isinstance(job, str | int) and isinstance(rank, int) and not isinstance(rank, bool):
            self._place(str(job), event.node, rank)
        if event.kind == Kind.NODE_OFFLINE and isinstance(event.data.get("jobs"), list):
            for j in event.data["jobs"]:
                if isinstance(j, str) and event.node not in self.state.job_nodes(j):
                    self._place(j, event.node, -1 - len(self.state.job_nodes(j)))
            node.online = False
        self._current = event
        try:
            await self.engine.handle_event(event)
        finally:
            self._current = None
        await self.sandbox.settle()
        self.report.events = self.engine.counters["events"]
        self.report.duplicates = self.engine.counters["duplicates"]

    async def close(self) -> None:
        await self.engine.close()


# --- input and output ------------------------------------------------------------------------------


class Progress:
    """A tiny progress bar on stderr (only drawn when stderr is a terminal and the input is big)."""

    def __init__(self, total: int, stream: IO[str] = sys.stderr, min_bytes: int = 1 << 20) -> None:
        self.total = total
        self.stream = stream
        self.enabled = total >= min_bytes and stream.isatty()
        self._last = 0.0

    def update(self, done: int, events: int, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        fraction = min(1.0, done / self.total) if self.total else 1.0
        width = 30
        filled = int(fraction * width)
        bar = "#" * filled + "-" * (width - filled)
        self.stream.write(f"\r[{bar}] {fraction * 100:5.1f}%  {events} events")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def read_events(
    stream: IO[bytes], report: Report, progress: Progress, *, node: str = "node-1"
) -> Iterator[Event]:
    from ftd.events import DecodeError, Event, decode

    done = 0
    last_ts = 0.0
    kernel: KernelLog | None = None
    for lineno, raw in enumerate(stream, 1):
        done += len(raw)
        line = raw.strip()
        if not line:
            continue
        if kernel is None and report.input != "json lines" and not line.startswith(b"{"):
            kernel = KernelLog(node)  # the first line is not JSON: a raw kernel log
            report.input, report.kernel_node = "kernel log", node
        report.input = report.input or "json lines"
        if kernel is not None:
            for event in kernel.feed(raw, lineno):
                report.kernel_events += 1
                yield event
            report.kernel_lines += 1
            progress.update(done, report.events)
            continue
        try:
            event = decode(line, Event)
        except DecodeError as exc:
            try:
                event = completed(line, lineno, node, last_ts)
            except ValueError:
                report.bad_lines.append((lineno, str(exc)[:200]))
                progress.update(done, report.events)
                continue
            report.filled += 1
        last_ts = max(last_ts, event.ts)
        yield event
        progress.update(done, report.events)
    if kernel is not None:
        for event in kernel.flush():  # a multi-line record the log ended in
            report.kernel_events += 1
            yield event
    progress.update(done, report.events, force=True)


class KernelLog:
    """A raw kernel log (dmesg, ``dmesg -T``, ``journalctl -k``, syslog, a ``/dev/kmsg`` dump) read
    through the agent's own kernel-log parser and wrapped as the agent wraps what it finds (source
    kmsg, node ``--node``, ``ts`` the kernel's timestamp when the line had one, else the previous
    event's): a line the parser finds nothing in is not an event, as on the node."""

    def __init__(self, node: str) -> None:
        from ftd.agent.kmsg_parse import KmsgParser

        self.node = node
        self.parser = KmsgParser()
        self.last_ts = 0.0

    def _wrap(self, found: list[Any]) -> list[Event]:
        from ftd.agent.watchers.kmsg import kernel_event_to_event

        out = []
        for n, kev in enumerate(found):
            ts = kev.ts if kev.ts is not None else self.last_ts
            self.last_ts = max(self.last_ts, ts)
            event_id = f"kmsg-{kev.line}" if n == 0 else f"kmsg-{kev.line}.{n}"  # unique per record
            out.append(kernel_event_to_event(self.node, kev, event_id=event_id, ts=ts))
        return out

    def feed(self, raw: bytes, lineno: int) -> list[Event]:
        return self._wrap(self.parser.feed(raw.decode("utf-8", errors="replace"), lineno))

    def flush(self) -> list[Event]:
        return self._wrap(self.parser.flush())


def completed(line: bytes, lineno: int, node: str, last_ts: float) -> Event:
    """An event from a line that is not a whole envelope: ``ftd parse kmsg`` output (wrapped as the
    agent wraps it) or an event missing ``id``/``node``/``ts``/``severity``/``source`` (filled).
    ValueError when the line is neither."""
    import msgspec

    from ftd.events import Event

    try:
        data = msgspec.json.decode(line)
    except msgspec.DecodeError as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    try:
        if "line" in data and "kind" in data and not {"node", "source", "id"} & data.keys():
            from ftd.agent.kmsg_parse import KernelEvent
            from ftd.agent.watchers.kmsg import kernel_event_to_event

            kev = msgspec.convert(data, KernelEvent)
            ts = kev.ts if kev.ts is not None else last_ts
            return kernel_event_to_event(node, kev, event_id=f"kmsg-{lineno}", ts=ts)
        filled = {
            "id": f"line-{lineno}",
            "node": node,
            "ts": last_ts,
            "severity": "warning",
            "source": "replay",
        }
        return msgspec.convert({**filled, **data}, Event)
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc)) from None


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts * 1000) % 1000:03d}Z"


def render_text(report: Report, out: IO[str]) -> None:
    for o in report.outcomes:
        verdict = o.verdict.upper() + (f" ({o.policy})" if o.policy else "")
        out.write(
            f"{_iso(o.ts)}  {o.event:<28}  {o.rule}: {o.kind} {o.target}  ->  {verdict}\n"
            f"{'':26}reason: {o.reason}   [event {o.event_id}]\n"
        )
    if report.outcomes:
        out.write("\n")
    rows = report.summary()
    headers = ("rule", "kind", *VERDICTS)
    table = [headers, *[tuple(str(r[h]) for h in headers) for r in rows]]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    for i, row in enumerate(table):
        out.write("  ".join(cell.ljust(widths[j]) for j, cell in enumerate(row)).rstrip() + "\n")
        if i == 0:
            out.write("  ".join("-" * w for w in widths) + "\n")
    if not rows:
        out.write("(no actions)\n")
    if report.filled:
        out.write(
            f"\n{report.filled} line(s) completed with defaults (ftd parse kmsg output or no id/node/ts)"
        )
    if report.input == "kernel log":
        out.write(
            f"\ninput: a kernel log: {report.kernel_lines} line(s), {report.kernel_events} event(s) found "
            f"by the agent's kernel-log parser (as node {report.kernel_node})"
        )
    out.write(f"\ncluster: {report.cluster}")
    out.write(
        f"\n{report.events} events replayed, {len(report.outcomes)} actions requested, "
        f"{report.duplicates} duplicate(s), {len(report.bad_lines)} bad line(s), "
        f"{len(report.rule_errors)} rule error(s)\n"
    )
    for err in report.rule_errors[:20]:
        out.write(f"rule error: {err['rule']} on event {err['event_id']}: {err['error']}\n")
    for lineno, error in report.bad_lines[:20]:
        out.write(f"bad line {lineno}: {error}\n")


def report_json(report: Report) -> dict[str, Any]:
    return {
        "events": report.events,
        "duplicates": report.duplicates,
        "bad_lines": [{"line": n, "error": e} for n, e in report.bad_lines],
        "rule_errors": report.rule_errors,
        "actions": [asdict(o) for o in report.outcomes],
        "summary": report.summary(),
        "filled": report.filled,
        "input": {
            "format": report.input or "json lines",
            "kernel_lines": report.kernel_lines,
            "kernel_events": report.kernel_events,
        },
        "cluster": {"source": report.cluster, "nodes": report.nodes},
    }


def _parse_jobs(specs: list[str]) -> dict[str, list[str]]:
    jobs: dict[str, list[str]] = {}
    for spec in specs:
        job, sep, nodes = spec.partition("=")
        names = [n.strip() for n in nodes.split(",") if n.strip()]
        if not sep or not job.strip() or not names:
            raise ValueError(f"--job {spec!r}: expected JOB=NODE[,NODE...]")
        jobs.setdefault(job.strip(), []).extend(names)
    return jobs


def cluster_of(args: argparse.Namespace, cfg: CoordinatorConfig) -> tuple[CoordinatorConfig, list[str], str]:
    """(config with the cluster's labels, the cluster's nodes, where they came from): a running
    coordinator (``--from URL``, ``--from-api``), else ``coordinator.node_labels``, else nothing."""
    import msgspec

    from ftd.commands.api_client import ApiTarget, target
    from ftd.config import NodeLabelsConfig
    from ftd.config.schema import NODE_LABELS as LABELS

    if args.from_url or args.from_api:
        if args.from_url:
            api = ApiTarget(str(args.from_url).rstrip("/"), "--from", None, 10.0)
        else:
            if not args.config:
                raise ValueError("--from-api reads coordinator.api from --config: pass --config too")
            api = target(argparse.Namespace(url=None, config=args.config, timeout=10.0))
        answer = api.get("/v1/nodes")
        names = sorted({str(n["name"]) for n in answer})
        # the live coordinator's labels, then the config's own (a later entry wins, as in the gate)
        labelled = [
            NodeLabelsConfig(nodes=[str(n["name"])], **{k: v for k, v in n["labels"].items() if k in LABELS})
            for n in answer
            if isinstance(n.get("labels"), dict) and n["labels"]
        ]
        cfg = msgspec.structs.replace(cfg, node_labels=[*labelled, *cfg.node_labels])
        return cfg, names, f"{len(names)} nodes from the coordinator at {api.url}"
    names = sorted({node for entry in cfg.node_labels for node in entry.nodes})
    if names:
        return cfg, names, f"{len(names)} nodes from coordinator.node_labels"
    return (
        cfg,
        [],
        (
            "only the nodes seen in the events (approximate drain budgets: pass --from URL, --from-api "
            "or a config with coordinator.node_labels)"
        ),
    )


async def _replay_all(replay: Replay, events: Iterator[Event]) -> None:
    try:
        for event in events:
            await replay.feed(event)
    finally:
        await replay.close()


def run_test(args: argparse.Namespace) -> int:
    from ftd.commands.api_client import ApiFailure
    from ftd.config import Config, ConfigError, load_config
    from ftd.coordinator.decide.plugins import PluginError

    try:
        config = load_config(args.config) if args.config else Config()
        jobs = _parse_jobs(args.job)
        cfg, nodes, source = cluster_of(args, config.coordinator)
        replay = Replay(
            cfg, jobs=jobs, action_s=args.action_s, entry_points=not args.no_entry_points, nodes=nodes
        )
    except (ConfigError, PluginError, ValueError, ApiFailure) as exc:
        print(f"ftd rules test: {exc}", file=sys.stderr)
        return 2
    replay.report.cluster = source
    try:
        if args.events == "-":
            stream: IO[bytes] = sys.stdin.buffer
            total = 0
        else:
            stream = open(args.events, "rb")  # noqa: SIM115 - closed below
            total = os.fstat(stream.fileno()).st_size
    except OSError as exc:
        print(f"ftd rules test: cannot read {args.events}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    progress = Progress(total)
    try:
        asyncio.run(_replay_all(replay, read_events(stream, replay.report, progress, node=args.node)))
    finally:
        progress.close()
        if stream is not sys.stdin.buffer:
            stream.close()
    if args.json:
        print(json.dumps(report_json(replay.report), default=str))
    else:
        render_text(replay.report, sys.stdout)
    return 0
