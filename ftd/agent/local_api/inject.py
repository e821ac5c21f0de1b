"""The local API's ``inject`` op: a drill's synthetic event, published by the agent itself.

Why: ``ftd inject`` used to log in to the broker with the node's own credentials. With the shipped
broker config (``use_username_as_clientid``) a second client under the node's name takes the
agent's session over: the agent's Last Will says ``offline``, the coordinator acts on the node's
"death" and the drill loses the very save it meant to rehearse (issue #20). Through the agent's
socket the event takes the real path instead: storm control, the spool, the agent's own session,
the coordinator's receipt.

What: :class:`InjectMsg` (``{"op": "inject", "kind": ..., "severity": ..., "data": {...}}``, joined
to the local API's decoder in :mod:`ftd.agent.local_api.wire`), :func:`injected_event` (the event,
marked ``source = "inject"`` so the ledger and the API show it for what it is) and :func:`reply`.
Who may send it: root or the agent's own user, like the Prolog's hooks (:data:`PRIVILEGED_OPS`;
the server refuses anyone else and counts it): a trainer must not be able to fake a fault.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from ftd.agent.jobs import PRIVILEGED
from ftd.client.protocol import PROTOCOL_VERSION
from ftd.events import Event, Kind, Severity, make_event

__all__ = ["INJECT", "PRIVILEGED_OPS", "InjectMsg", "injected_event", "reply"]

INJECT = "inject"
MAX_DATA_KEYS = 64


class InjectMsg(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag=INJECT):
    v: int = PROTOCOL_VERSION
    kind: Kind
    severity: Severity
    data: Annotated[dict[str, Any], msgspec.Meta(max_length=MAX_DATA_KEYS)] = msgspec.field(
        default_factory=dict
    )


PRIVILEGED_OPS = (*PRIVILEGED, InjectMsg)
"""The local API's operations only root or the agent's own uid may send."""


def injected_event(node: str, msg: InjectMsg) -> Event:
    """The drill's event as this node's agent reports it."""
    return make_event(node, msg.kind, severity=msg.severity, source=INJECT, data=dict(msg.data))


def reply(event: Event) -> dict[str, Any]:
    """The answer to ``inject``: the event's id (find it in ``ftd status``, ``/v1/events``)."""
    return {"v": PROTOCOL_VERSION, "op": INJECT, "id": event.id, "node": event.node, "kind": str(event.kind)}
