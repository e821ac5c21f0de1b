"""Topic names (v1) and MQTT wildcard matching.

Every topic ftd uses is built here so a typo cannot invent a new one. Layout (docs/architecture.md §4)::

    ftd/v1/nodes/{node}/status              retained NodeStatus; Last Will says offline
    ftd/v1/nodes/{node}/events/{kind}       Event
    ftd/v1/nodes/{node}/events/batch        a JSON array of Events (one message, many events)
    ftd/v1/nodes/{node}/conditions/{type}   retained, on change
    ftd/v1/nodes/{node}/jobs/{job}          retained JobPresence (empty payload clears)
    ftd/v1/nodes/{node}/acks                Ack from a trainer, relayed by the agent
    ftd/v1/nodes/{node}/directives          Directive, coordinator -> agent (gpu_reset, diagnostics)
    ftd/v1/nodes/{node}/directives/jobs     Directive for a job (save, stop), coordinator -> the agent
                                            of each node the job runs on -> its trainers
    ftd/v1/nodes/{node}/receipts            Receipt, coordinator -> agent: events committed
    ftd/v1/coordinator/status               retained CoordinatorStatus; Last Will says offline
    ftd/v1/bridges/{rack}/state             retained "1"/"0": a rack broker's bridge to the core broker
                                            is up / down (Mosquitto's bridge notification; its Last
                                            Will on the core says 0)

Everything a node publishes lives under its own ``nodes/{node}/`` subtree, except ``directives``
(and ``directives/jobs``) and ``receipts``, which only the coordinator may write; the Mosquitto ACL
in ``deploy/mosquitto`` enforces that.

Why job directives go per node (``nodes/{node}/directives/jobs``) and not to one
``ftd/v1/jobs/{job}/directives`` topic every agent reads: an ACL cannot express "the jobs this node
hosts", so with a shared job topic every node could read every job's save and stop directives and
answer them (issue #11, a forged acknowledgement). Per node, the ACL's ``%u`` pattern lets a node read
its own directives only, and the coordinator sends a job's directive once to each node that runs it
(:func:`job_directives_for`). A separate level from ``directives`` keeps the agent's dispatch on the
topic alone (a ``collect_diagnostics`` node directive may name a job too).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

PREFIX = "ftd/v1"

# Names that appear as one topic level: no wildcards, no separators, no NUL, not empty.
_LEVEL_RE = re.compile(r"^[^/#+\x00]{1,128}$")


class TopicError(ValueError):
    pass


def check_level(value: str, what: str = "name") -> str:
    if not _LEVEL_RE.match(value):
        raise TopicError(f"invalid {what} {value!r}: must be 1-128 chars without '/', '+', '#' or NUL")
    return value


def node_status(node: str) -> str:
    return f"{PREFIX}/nodes/{check_level(node, 'node')}/status"


def node_event(node: str, kind: str) -> str:
    return f"{PREFIX}/nodes/{check_level(node, 'node')}/events/{check_level(kind, 'kind')}"


#: The ``{kind}`` level of a batched event message: never a Kind value, matched by ALL_NODE_EVENTS.
EVENT_BATCH = "batch"


def node_event_batch(node: str) -> str:
    """Where a node publishes several events in one message (a JSON array of Events)."""
    return node_event(node, EVENT_BATCH)


def node_condition(node: str, type_: str) -> str:
    return f"{PREFIX}/nodes/{check_level(node, 'node')}/conditions/{check_level(type_, 'condition')}"


def node_job(node: str, job: str) -> str:
    return f"{PREFIX}/nodes/{check_level(node, 'node')}/jobs/{check_level(job, 'job')}"


def node_acks(node: str) -> str:
    return f"{PREFIX}/nodes/{check_level(node, 'node')}/acks"


def node_directives(node: str) -> str:
    return f"{PREFIX}/nodes/{check_level(node, 'node')}/directives"


def node_receipts(node: str) -> str:
    return f"{PREFIX}/nodes/{check_level(node, 'node')}/receipts"


def node_job_directives(node: str) -> str:
    """Where the agent of ``node`` receives the directives of the jobs running on it."""
    return f"{PREFIX}/nodes/{check_level(node, 'node')}/directives/jobs"


def job_directives_for(nodes: Iterable[str]) -> list[str]:
    """The topics a job's directive goes to: one per node the job runs on (sorted, no repeats)."""
    return [node_job_directives(node) for node in sorted(set(nodes))]


COORDINATOR_STATUS = f"{PREFIX}/coordinator/status"


def bridge_state(rack: str) -> str:
    """Where rack broker ``rack``'s bridge says it is connected to the core broker (``1``) or not
    (``0``): its ``notification_topic`` (deploy/mosquitto/bridge/rack-bridge.conf)."""
    return f"{PREFIX}/bridges/{check_level(rack, 'rack broker')}/state"


# Subscription patterns.
ALL_NODE_EVENTS = f"{PREFIX}/nodes/+/events/+"
ALL_NODE_STATUS = f"{PREFIX}/nodes/+/status"
ALL_NODE_JOBS = f"{PREFIX}/nodes/+/jobs/+"
ALL_NODE_ACKS = f"{PREFIX}/nodes/+/acks"
ALL_NODE_CONDITIONS = f"{PREFIX}/nodes/+/conditions/+"
ALL_BRIDGE_STATE = f"{PREFIX}/bridges/+/state"
#: The ``{type}`` level of the agent's own condition summary (:class:`ftd.events.NodeConditions`).
FTD_CONDITIONS = "ftd"


def matches(pattern: str, topic: str) -> bool:
    """MQTT 3.1.1 topic-filter matching (``+`` one level, ``#`` the rest, ``$``-topics excluded)."""
    if topic.startswith("$") and not pattern.startswith("$"):
        return False
    p_levels = pattern.split("/")
    t_levels = topic.split("/")
    for i, p in enumerate(p_levels):
        if p == "#":
            return True  # '#' also matches the parent level itself ("a/#" matches "a")
        if i >= len(t_levels):
            return False
        if p != "+" and p != t_levels[i]:
            return False
    return len(p_levels) == len(t_levels)


def parse(topic: str) -> tuple[str, ...]:
    """Split a v1 topic into its levels after the prefix; raise TopicError for foreign topics."""
    if not topic.startswith(PREFIX + "/"):
        raise TopicError(f"not an ftd v1 topic: {topic!r}")
    return tuple(topic[len(PREFIX) + 1 :].split("/"))
