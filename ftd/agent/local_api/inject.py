"""The local API's ``inject`` op: a drill's synthetic event, published by the agent itself.

Why: ``ftd inject`` used to log in to the broker with the node's own credentials. With the shipped
broker config (``use_username_as_clientid``) a second client under the node's name takes the
agent's session over: the agent's Last Will says ``offline``, the coordinator acts on the node's
"death" and the drill loses the very save it meant to rehearse (issue #20). Through the agent's
socket the event takes the real path instead: storm control, the spool, the agent's own session,
the coordinator's receipt.

What: :class:`InjectMsg` (``{"op": "inject", "kind": ..., "severity": ..., "data": {...}}``, joined
to the local API's decoder in :mod:`ftd.agent.local_api.wire`), :func:`injected_event` (the event,
marked ``source = "inject"`` and ``data.drill = true`` so the ledger, the node's condition, the
actions and notifications show it for what it is) and :func:`reply`.

A drill of a kernel-log fault rehearses the real line (issue #32): an ``xid``, ``sxid`` or
``gpu_fallen_off_bus`` drill is written as the kernel line the driver prints (``data.line``, or one
rendered from ``code``, ``pci``, ``pid``, ``process``, ``fatal``) and read by the kmsg watcher's own
parser (:mod:`ftd.agent.kmsg_parse`, :func:`~ftd.agent.watchers.kmsg.kernel_event_to_event`), so it
carries the same severity, catalogue action, name and fields as the real fault, and opens the same
condition. Severity is the parser's (the Xid catalogue's) unless the message names one; a line the
parser does not read as that kind is refused with a sentence saying so.
Who may send it: root or the agent's own user, like the Prolog's hooks (:data:`PRIVILEGED_OPS`;
the server refuses anyone else and counts it): a trainer must not be able to fake a fault.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from ftd.agent.jobs import PRIVILEGED
from ftd.agent.kmsg_parse import KernelEvent, KmsgParser
from ftd.agent.watchers.kmsg import kernel_event_to_event
from ftd.client.protocol import PROTOCOL_VERSION
from ftd.events import Event, Kind, Severity, make_event
from ftd.pci import normalize_pci

__all__ = ["INJECT", "KERNEL_KINDS", "PRIVILEGED_OPS", "DrillError", "InjectMsg", "injected_event", "reply"]

INJECT = "inject"
MAX_DATA_KEYS = 64
MAX_LINE = 4096
#: The kinds a drill writes as a kernel line and reads through the kmsg parser.
KERNEL_KINDS = frozenset({Kind.XID, Kind.SXID, Kind.GPU_FALLEN_OFF_BUS})
#: Parsed fields that describe the drill's synthetic line, not the fault (dropped from the event).
_LINE_ONLY = ("line", "seq", "kernel_ts")


class DrillError(ValueError):
    """The drill's data cannot be made into the kernel line of its kind; the message says why."""


class InjectMsg(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag=INJECT):
    v: int = PROTOCOL_VERSION
    kind: Kind
    severity: Severity | None = None  # None: the severity the real kernel line has (the catalogue's)
    data: Annotated[dict[str, Any], msgspec.Meta(max_length=MAX_DATA_KEYS)] = msgspec.field(
        default_factory=dict
    )


PRIVILEGED_OPS = (*PRIVILEGED, InjectMsg)
"""The local API's operations only root or the agent's own uid may send."""


def injected_event(node: str, msg: InjectMsg) -> Event:
    """The drill's event as this node's agent reports it (raises :class:`DrillError`)."""
    data = dict(msg.data)
    if msg.kind in KERNEL_KINDS:
        line = kernel_line(msg.kind, data)
        parsed = kernel_event_to_event(node, _parse(msg.kind, line))
        fields = {k: v for k, v in parsed.data.items() if k not in _LINE_ONLY}
        extra = {k: v for k, v in data.items() if k not in fields and k != "line"}
        severity = msg.severity or parsed.severity
        data = {**extra, **fields, "kernel_line": line}
    else:
        severity = msg.severity or Severity.WARNING
    data["drill"] = True
    return make_event(node, msg.kind, severity=severity, source=INJECT, data=data)


def kernel_line(kind: Kind, data: dict[str, Any]) -> str:
    """The kernel line the driver prints for this fault: ``data["line"]`` as given, else one in the
    current drivers' format from ``code``, ``pci``, ``pid``, ``process`` (and ``fatal`` for an SXid)."""
    given = data.get("line")
    if given is not None:
        if not isinstance(given, str) or not given.strip() or len(given) > MAX_LINE or "\n" in given:
            raise DrillError(f"data.line must be one kernel log line of at most {MAX_LINE} characters")
        return given.strip()
    pci = data.get("pci")
    address = normalize_pci(pci) if isinstance(pci, str) else None
    if pci is not None and address is None:
        raise DrillError(f"data.pci {str(pci)[:60]!r} is not a PCI address (dddd:bb:dd.f)")
    if kind == Kind.GPU_FALLEN_OFF_BUS:
        where = f"GPU at PCI:{address[:-2]}: " if address else ""
        return f"NVRM: {where}GPU has fallen off the bus."
    code = data.get("code")
    if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code < 1_000_000:
        raise DrillError(f"a {kind} drill needs data.code, the {kind} number (or data.line, the kernel line)")
    if kind == Kind.SXID:
        fatal = "Fatal" if data.get("fatal") is True else "Non-fatal"
        return f"nvidia-nvswitch0: SXid (PCI:{address or '0000:00:00.0'}): {code}, {fatal}, ftd drill"
    where = f" (PCI:{address[:-2]})" if address else ""
    pid, process = data.get("pid"), data.get("process")
    pid_text = str(pid) if isinstance(pid, int) and not isinstance(pid, bool) else "'<unknown>'"
    name = process if isinstance(process, str) and process.isprintable() and process else "<unknown>"
    return f"NVRM: Xid{where}: {code}, pid={pid_text}, name={name[:64]}, ftd drill"


def _parse(kind: Kind, line: str) -> KernelEvent:
    parser = KmsgParser()
    found = [e for e in (*parser.feed(line, 1), *parser.flush()) if e.kind == kind]
    if not found:
        raise DrillError(f"the kernel log parser does not read {line[:200]!r} as {kind}")
    return found[0]


def reply(event: Event) -> dict[str, Any]:
    """The answer to ``inject``: the event's id (find it in ``ftd status``, ``/v1/events``)."""
    return {"v": PROTOCOL_VERSION, "op": INJECT, "id": event.id, "node": event.node, "kind": str(event.kind)}
