"""Which rack broker each node is on, and which rack brokers' bridges to the core broker are down.

Why: in a bridged broker tier (deploy/mosquitto/bridge/) a node's Last Will is fired by its *rack*
broker. A rack broker that dies takes its nodes' sessions with it and fires none of them, so the
coordinator, on the core broker, would go on seeing those nodes ``online`` and restart none of
their jobs until something else noticed. Mosquitto's bridge notifications close the gap: the bridge
publishes a retained ``1`` on ``ftd/v1/bridges/{rack}/state`` when it connects to the core, and
registers a Last Will ``0`` on that topic with the core, which fires it when the bridge's connection
dies (a killed rack broker: at once; a machine or link gone silent: after 1.5x the bridge's
``keepalive_interval``). Checked on Mosquitto 2.0.11: both arrive, the Will only if the core's ACL
lets the bridge write its topic (otherwise the core drops it silently; bridge/core.acl allows it).

What (pure bookkeeping; the daemon does the I/O and the grace, with
:mod:`ftd.coordinator.intake.offline_grace`):

- :meth:`RackBridges.seen`: the rack broker a node's status names (``NodeStatus.rack_broker``,
  its agent's ``[bus] rack_broker``; empty: the core broker);
- :func:`bridge_up`: the notification's payload, ``1`` or ``0`` (anything else is refused);
- :meth:`RackBridges.went`: a rack's bridge went up or down; True only on a change (a second ``0``,
  the retained ``1`` a restarted coordinator reads: nothing to do);
- :meth:`RackBridges.nodes_on`: the nodes on a rack among those given (the online ones);
- :meth:`RackBridges.down_rack`: the rack of a node whose bridge is down (a retained ``online`` of
  that node is its word from before the rack went dark, not a sign of life).

A node names its own rack: a node that names the wrong one only mislabels itself (it is taken for
gone when that other rack's bridge dies, until its next message arrives, or missed when its own does).
"""

from __future__ import annotations

from collections.abc import Iterable

from ftd.bus import topics
from ftd.events import DecodeError

__all__ = ["RackBridges", "bridge_up"]


def bridge_up(payload: bytes) -> bool:
    """A bridge notification's payload: ``1`` (connected to the core) or ``0`` (not); else DecodeError."""
    if payload == b"1":
        return True
    if payload == b"0":
        return False
    raise DecodeError(f"bridge state must be 1 or 0, got {payload[:20]!r}")


class RackBridges:
    """Each node's rack broker (from its status) and the racks whose bridge is down."""

    def __init__(self) -> None:
        self._rack: dict[str, str] = {}  # node -> rack broker; nodes on the core are not kept
        self._down: set[str] = set()

    def seen(self, node: str, rack_broker: str) -> None:
        """``node``'s status names ``rack_broker`` (empty: the core). Raises TopicError for a name that
        is no topic level (the status is then refused as invalid)."""
        if rack_broker:
            self._rack[node] = topics.check_level(rack_broker, "rack broker")
        else:
            self._rack.pop(node, None)

    def rack_of(self, node: str) -> str:
        """The rack broker ``node`` last said it is on ("" for the core, or not known)."""
        return self._rack.get(node, "")

    def went(self, rack: str, up: bool) -> bool:
        """Rack ``rack``'s bridge is now up or down; True when that changes what is known (a rack never
        heard of is taken as up)."""
        if up:
            if rack not in self._down:
                return False
            self._down.discard(rack)
            return True
        if rack in self._down:
            return False
        self._down.add(rack)
        return True

    def is_down(self, rack: str) -> bool:
        return rack in self._down

    def down_rack(self, node: str) -> str | None:
        """The rack of ``node`` when its bridge is down, else None."""
        rack = self._rack.get(node)
        return rack if rack is not None and rack in self._down else None

    def nodes_on(self, rack: str, among: Iterable[str]) -> list[str]:
        """The nodes of ``among`` that said they are on rack broker ``rack``, in ``among``'s order."""
        return [node for node in among if self._rack.get(node) == rack]
