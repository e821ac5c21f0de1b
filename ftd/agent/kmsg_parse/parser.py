"""Pure kernel-log parser: text lines in, :class:`KernelEvent` out. No I/O, never raises.

What it understands (docs/architecture.md §5 "kmsg"):

* **Line shapes** (``/dev/kmsg``, ``dmesg`` with or without ``-T``/``-x``/iso time, syslog,
  ``journalctl -k``, caller tags): see :mod:`ftd.agent.kmsg_parse.prefix`.
* **Events**: NVIDIA Xid in every driver era (with or without ``PCI:``, with ``pid=``/``name=`` or
  ``Ch``/``Channel``, ``pid='<unknown>'``), NVSwitch SXid, the "GPU has fallen off the bus" banner
  (single-line and the older three-line form), the ``NVRM: GPU at PCI:... GPU-<uuid>`` line (kept as a
  PCI -> UUID map attached to later events), PCIe AER, the OOM killer, hung tasks and mlx5/IPoIB link
  down.
* **Host signal families** (:mod:`ftd.agent.kmsg_parse.families`): storage, read-only remounts,
  NFS/Lustre, mlx5/EFA, nvidia-peermem, NVLink link masks, machine checks, lockups, oopses,
  segfaults, resource limits; their documented fields (docs/signals.md) go to ``KernelEvent.data``.

The Xid code is the first number *after the closing parenthesis* of the device address, never "the
first number after Xid" (that is the PCI domain). Xid 154 also carries the driver's recovery action
in text ("... to 0x2 (Node Reboot Required)"); it becomes the event's ``action``.

Speed: almost every kernel line is noise, so each line first goes through a handful of substring
tests (:func:`~ftd.agent.kmsg_parse.patterns.is_candidate`); regular expressions only run on lines
that pass. Prefixes are parsed only for those candidate lines as well, by one regular expression.

Repeats: a sick GPU prints the same Xid line hundreds of thousands of times, and only the prefix
(timestamp, sequence number) differs. An Xid/SXid message is parsed once; the result is kept as a
:class:`Template` under the message text (the line after its prefix), and a later line with the same
message text is the template plus that line's prefix (:meth:`KmsgParser.cached`,
:meth:`KmsgParser.expand`): the same :class:`KernelEvent` a full parse gives, since an Xid's fields
depend only on its message text, except the PCI -> UUID map (a template remembers the UUID it was
made with and is not used once the map says otherwise) and the Xid 79 memory (applied on every
hit). Other kinds are never cached: they depend on the lines around them (banners, folded pairs).
``cache_size=0`` turns the cache off (the tests compare both).

Duplicate suppression inside one incident (documented choices):

* The kernel prints an OOM kill twice (``oom-kill:...`` then ``Killed process N``): the second line
  is folded into the first when the pid matches and it comes within a few lines.
* An AER incident prints ``AER: ... error received`` then ``PCIe Bus Error: severity=...``: the
  detail line is folded into the first within a few lines.
* After ``Xid 79`` the driver also prints ``GPU ... has fallen off the bus``: that line is folded
  into the Xid event for the same PCI address. The fall-off banner *without* an Xid becomes a
  ``gpu_fallen_off_bus`` event (action RESTART_BM).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from ftd.agent.kmsg_parse.families import match_family, stack_header
from ftd.agent.kmsg_parse.patterns import (
    AER_DETAIL_RE,
    AER_RECEIVED_RE,
    ANY_PCI_RE,
    BANNER_START_RE,
    CHANNEL_RE,
    DEVICE_RE,
    HEX_WORD_RE,
    HUNG_RE,
    IB_IFACE_RE,
    IFACE_RE,
    LINK_DOWN_RE,
    OOM_KILL_RE,
    OOM_KILLED_RE,
    PREVIOUS_RE,
    SXID_DATA_RE,
    SXID_DETAIL_RE,
    SXID_LINK_RE,
    SXID_RE,
    SXID_WORD_RE,
    UUID_LINE_RE,
    XID_RE,
    is_candidate,
    nvlink5,
    pid_name,
    recovery_action,
    to_int,
    xid_address,
    xid_details,
)
from ftd.agent.kmsg_parse.prefix import BRACKET_PREFIX_RE, DICT_RE, PREFIX_RE, Prefix, strip_prefix
from ftd.catalog import XidCatalog, load_xid_catalog
from ftd.events import Kind
from ftd.pci import normalize_pci

__all__ = ["KernelEvent", "KmsgParser", "Template", "parse_lines"]


class KernelEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One recognised kernel event (docs/architecture.md §9 keys plus context)."""

    line: int  # 1-based number of the record's first input line
    kind: Kind
    code: int | None = None
    pci: str | None = None  # lowercase dddd:bb:dd.f
    pid: int | None = None
    process: str | None = None
    action: str | None = None  # catalog bucket (Xid) or ftd's bucket for the non-Xid kinds
    severity: str = "warning"
    message: str = ""
    ts: float | None = None  # kernel timestamp, seconds since boot
    seq: int | None = None  # /dev/kmsg sequence number
    uuid: str | None = None
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    data: dict[str, Any] = msgspec.field(default_factory=dict)  # the kind's own fields (docs/signals.md)


_FOLD_WINDOW = 5  # lines within which a detail line is folded into its header event
_BANNER_WINDOW = 8  # lines within which the three-line fall-off banner must complete
_XID79_WINDOW = 50  # lines after an Xid 79 within which "fallen off the bus" is the same incident
_SXID_WINDOW = 20  # lines after an SXid header within which its detail lines are folded into it
_FAMILY_WINDOW = 30  # lines within which a family's repeats (stack frames, MCE records) are one event
_TRACE_WINDOW = 60  # lines after an oops / lockup / WARNING within which its stack header is part of it


class Template:
    """An Xid/SXid message parsed once: ``event`` is what any line with that message text parses to,
    except ``line``, ``ts``, ``seq`` and ``extra["time"]`` (that line's own; see :meth:`KmsgParser.expand`).
    ``memo`` is free for the caller (the kmsg watcher keeps its storm-control key there)."""

    __slots__ = ("event", "memo")

    def __init__(self, event: KernelEvent) -> None:
        self.event = event
        self.memo: Any = None


_CACHED_KINDS = (Kind.XID, Kind.SXID)
_MAX_LINE = 65536  # longer lines are cut here before parsing


class KmsgParser:
    """Stateful line parser. State is only what multi-line records need (see module doc), plus the
    cache of parsed Xid/SXid messages (at most ``cache_size``; 0 turns it off)."""

    def __init__(self, catalog: XidCatalog | None = None, *, cache_size: int = 1024) -> None:
        self._catalog = catalog or load_xid_catalog()
        self._uuids: dict[str, str] = {}
        self._banner: tuple[int, str | None, Prefix] | None = None  # (line, pci, prefix)
        self._recent: dict[tuple[str, Any], int] = {}  # (fold key) -> line number
        self._templates: dict[str, Template] = {}  # message text -> its parse
        self.cache_size = cache_size

    def feed(self, line: str, lineno: int) -> list[KernelEvent]:
        """Parse one input line (``lineno`` is 1-based). Never raises."""
        if not is_candidate(line):
            return []
        try:
            template = self.cached(line, lineno)
            if template is not None:
                return [self.expand(template, line, lineno)]
            return self._parse(line, lineno)
        except Exception:  # a parser bug must never take the agent down
            return []

    def cached(self, line: str, lineno: int) -> Template | None:
        """The template of ``line`` when its message text was parsed before (else None: use
        :meth:`feed`). Counts as parsing line ``lineno``: the parser's state moves as :meth:`feed`
        would move it. Call it only for lines :func:`is_candidate` accepts."""
        templates = self._templates
        if not templates or "Xid" not in line or line[:1] == " " or len(line) > _MAX_LINE:
            return None  # not an Xid/SXid line, a dictionary continuation, a long line: parse it
        prefix = (BRACKET_PREFIX_RE if line[:1] == "[" else PREFIX_RE).match(line)
        template = templates.get(line[prefix.end() :].rstrip("\r\n") if prefix else line)
        if template is None:
            return None
        event = template.event
        # The map only grows: while it is empty, every template was made with it empty.
        if self._uuids and event.pci is not None and self._uuids.get(event.pci) != event.uuid:
            return None  # the UUID map changed since: parse again (the new template replaces this one)
        if event.code == 79 and event.kind is Kind.XID:
            self._remember(("xid79", event.pci), lineno)
        elif event.kind is Kind.SXID:
            self._remember(("sxid", (event.pci, event.code)), lineno)  # its detail lines fold into it
        return template

    def expand(self, template: Template, line: str, lineno: int) -> KernelEvent:
        """The event of ``line`` (number ``lineno``), whose message text is ``template``'s: the
        template with this line's number and prefix fields. Pure: the parser's state is not read."""
        prefix = strip_prefix(line)
        extra = dict(template.event.extra)
        if prefix.time is not None:
            extra["time"] = prefix.time
        return msgspec.structs.replace(template.event, line=lineno, ts=prefix.ts, seq=prefix.seq, extra=extra)

    def _keep(self, message: str, event: KernelEvent) -> None:
        """Remember the parse of an Xid/SXid message for :meth:`cached`."""
        if self.cache_size <= 0:
            return
        if len(self._templates) >= self.cache_size:
            self._templates.clear()  # a storm of distinct messages: start over rather than track ages
        extra = {key: value for key, value in event.extra.items() if key != "time"}
        self._templates[message] = Template(
            msgspec.structs.replace(event, line=0, ts=None, seq=None, extra=extra)
        )

    def flush(self) -> list[KernelEvent]:
        """End of input: drop partial multi-line state. Returns events still pending (none today)."""
        self._banner = None
        self._recent.clear()
        return []

    # --- dispatch -------------------------------------------------------------------------------

    def _parse(self, line: str, lineno: int) -> list[KernelEvent]:
        if line[:1] == " " and DICT_RE.match(line):
            return []  # /dev/kmsg dictionary continuation line (KEY=value)
        if len(line) > _MAX_LINE:
            line = line[:_MAX_LINE]
        prefix = strip_prefix(line)
        msg = prefix.message
        if "SXid" in msg:  # before "Xid": an SXid line contains both
            sxid = self._sxid(msg, lineno, prefix)
            if sxid is not None:
                return sxid
        elif "Xid" in msg:
            event = self._xid(msg, lineno, prefix)
            if event is not None:
                if event.kind in _CACHED_KINDS:
                    self._keep(msg, event)
                return [event]
        if "NVRM" in msg:  # the NVIDIA driver's: only its NVLink link-mask lines are a family's
            family = self._family(msg, lineno, prefix) if "knvlink" in msg else None
            return self._nvrm(msg, lineno, prefix) if family is None else family
        if "AER" in msg or "PCIe Bus Error" in msg:
            return self._aer(msg, lineno, prefix)
        family = self._family(msg, lineno, prefix)
        if family is not None:
            return family
        if "oom-kill" in msg or "Killed process" in msg:
            return self._oom(msg, lineno, prefix)
        if "blocked for more than" in msg:
            return self._hung(msg, lineno, prefix)
        return self._link(msg, lineno, prefix)

    def _event(self, lineno: int, prefix: Prefix, kind: Kind, **fields: Any) -> KernelEvent:
        pci = fields.get("pci")
        if pci is not None and "uuid" not in fields:
            fields["uuid"] = self._uuids.get(pci)
        extra = fields.setdefault("extra", {})
        if prefix.time is not None:
            extra["time"] = prefix.time
        return KernelEvent(
            line=lineno, kind=kind, message=prefix.message, ts=prefix.ts, seq=prefix.seq, **fields
        )

    def _fold(self, key: tuple[str, Any], lineno: int, window: int) -> bool:
        """True when ``key`` was recorded within ``window`` lines before ``lineno``."""
        seen = self._recent.get(key)
        return seen is not None and 0 <= lineno - seen <= window

    def _remember(self, key: tuple[str, Any], lineno: int) -> None:
        if len(self._recent) > 256:
            self._recent.clear()
        self._recent[key] = lineno

    # --- host signal families (families.py) ----------------------------------------------------

    def _family(self, msg: str, lineno: int, prefix: Prefix) -> list[KernelEvent] | None:
        """A host-family event (None: not one of theirs, the other parsers go on). Repeats of a
        ``fold`` key within :data:`_FAMILY_WINDOW` lines are one incident; the ``CPU: N PID: N Comm:``
        header of a trace an oops, lockup or ``WARNING:`` started is part of it, not an event."""
        if msg[:13] == "WARNING: CPU:":
            self._remember(("trace", None), lineno)
            return []
        found = match_family(msg)
        if found is None:
            found = stack_header(msg) if "Comm:" in msg else None
            if found is None:
                return None
            if self._fold(("trace", None), lineno, _TRACE_WINDOW):
                return []
        if found.trace:
            self._remember(("trace", None), lineno)
        if found.fold is not None:
            key = ("family", (found.fold, found.severity))
            folded = self._fold(key, lineno, _FAMILY_WINDOW)
            self._remember(key, lineno)
            if folded:
                return []
        return [
            self._event(
                lineno, prefix, found.kind, pci=found.pci, pid=found.pid, process=found.process,
                severity=found.severity, extra=dict(found.extra), data=dict(found.data),
            )
        ]  # fmt: skip

    # --- NVIDIA ---------------------------------------------------------------------------------

    def _xid(self, msg: str, lineno: int, prefix: Prefix) -> KernelEvent | None:
        match = XID_RE.search(msg)
        if match is None:
            return None
        code = int(match.group(2))
        rest = match.group(3)
        info = self._catalog.get(code)
        extra: dict[str, Any] = {"name": info.name}
        pci = xid_address(match.group(1), extra)
        if not info.known:
            extra["unknown_code"] = True
        xid_details(code, rest, extra)
        action, severity = info.action, info.severity
        pid, process = pid_name(rest)
        channel = CHANNEL_RE.search(rest)
        if channel is not None:
            extra["channel"] = channel.group(1).lower()
        previous = PREVIOUS_RE.search(rest)
        if previous is not None:
            extra["caused_by_previous"] = int(previous.group(1)) if previous.group(1) else True
        if code == 154:
            action, severity = recovery_action(rest, extra, action, severity)
        if 144 <= code <= 150:
            severity = nvlink5(code, rest, extra, severity)
        if code == 79:
            self._remember(("xid79", pci), lineno)
        return self._event(
            lineno, prefix, Kind.XID, code=code, pci=pci, pid=pid, process=process,
            action=action, severity=severity, extra=extra,
        )  # fmt: skip

    def _sxid(self, msg: str, lineno: int, prefix: Prefix) -> list[KernelEvent] | None:
        """An NVSwitch SXid: the header line is the event; the driver's two detail lines that follow
        it (``Severity N Engine instance ...`` and ``Data {...}``) are folded into it. A severity line
        without its header (lost from the ring buffer) is an event of its own (``Severity 1``:
        fatal); a data line alone is not. None: not an SXid line after all."""
        match = SXID_RE.search(msg)
        if match is None:
            return None
        code, pci = int(match.group(3)), normalize_pci(match.group(2))
        rest = match.group(4)
        key = ("sxid", (pci, code))
        extra: dict[str, Any] = {}
        if match.group(1):
            extra["switch"] = match.group(1)
        if SXID_DATA_RE.match(rest):
            # Raw registers: part of the header's incident. Alone (the header and the severity line
            # lost from the ring buffer), the SXid is still reported, its fatality unknown.
            if self._fold(key, lineno, _SXID_WINDOW):
                return []
            self._remember(key, lineno)
            extra.update(fatal=None, header_missing=True, registers=HEX_WORD_RE.findall(rest[:400]))
            return [
                self._event(
                    lineno, prefix, Kind.SXID, code=code, pci=pci, action=None, severity="warning",
                    extra=extra,
                )
            ]  # fmt: skip
        detail = SXID_DETAIL_RE.match(rest)
        if detail is not None:
            if self._fold(key, lineno, _SXID_WINDOW):
                return []
            self._remember(key, lineno)  # its data line folds into it
            fatal = detail.group(1) == "1"  # NVSWITCH_ERROR_SEVERITY_FATAL
            extra.update(
                fatal=fatal,
                severity_level=int(detail.group(1)),
                engine_instance=int(detail.group(2)),
                subengine_instance=int(detail.group(3)),
            )
            return [
                self._event(
                    lineno, prefix, Kind.SXID, code=code, pci=pci, action=None,
                    severity="critical" if fatal else "warning", extra=extra,
                )
            ]  # fmt: skip
        head = rest[:40].lower()
        nonfatal = "non-fatal" in head or "nonfatal" in head
        fatal = "fatal" in head and not nonfatal
        extra["fatal"] = fatal
        word = SXID_WORD_RE.match(rest)
        if word is not None:
            extra["sxid_severity"] = "fatal" if fatal else "non-fatal"
            extra["detail"] = rest[word.end() :].strip()
        link = SXID_LINK_RE.search(rest)
        if link is not None:
            extra["link"] = int(link.group(1))
        if rest.rstrip().endswith("(First)"):
            extra["first"] = True
        self._remember(key, lineno)
        event = self._event(
            lineno, prefix, Kind.SXID, code=code, pci=pci, action=None,
            severity="critical" if fatal else "warning", extra=extra,
        )  # fmt: skip
        self._keep(msg, event)
        return [event]

    def _nvrm(self, msg: str, lineno: int, prefix: Prefix) -> list[KernelEvent]:
        uuid_match = UUID_LINE_RE.search(msg)
        if uuid_match is not None:
            pci = normalize_pci(uuid_match.group(1))
            if pci is not None:
                self._uuids[pci] = uuid_match.group(2).lower().replace("gpu-", "GPU-", 1)
            return []
        banner = BANNER_START_RE.search(msg)
        if banner is not None and "fallen off" not in msg:
            self._banner = (lineno, normalize_pci(banner.group(1)), prefix)
            return []
        if "fallen off the bus" not in msg:
            return []
        return self._fallen_off(msg, lineno, prefix)

    def _fallen_off(self, msg: str, lineno: int, prefix: Prefix) -> list[KernelEvent]:
        first_line, pci = lineno, None
        if self._banner is not None and lineno - self._banner[0] <= _BANNER_WINDOW:
            first_line, pci, prefix = self._banner
        self._banner = None
        if pci is None:
            any_pci = ANY_PCI_RE.search(msg)
            pci = normalize_pci(any_pci.group(1)) if any_pci else None
        if self._fold(("xid79", pci), lineno, _XID79_WINDOW):
            return []  # the driver's own repeat of an Xid 79 already reported
        self._remember(("xid79", pci), lineno)
        return [
            self._event(
                first_line, prefix, Kind.GPU_FALLEN_OFF_BUS, code=None, pci=pci, action="RESTART_BM",
                severity="critical", extra={},
            )
        ]  # fmt: skip

    # --- PCIe AER -------------------------------------------------------------------------------

    def _aer(self, msg: str, lineno: int, prefix: Prefix) -> list[KernelEvent]:
        device = DEVICE_RE.match(msg)
        dev_pci = normalize_pci(device.group(2)) if device else None
        received = AER_RECEIVED_RE.search(msg)
        if received is not None:
            level = received.group(1)
            source = normalize_pci(received.group(2)) if received.group(2) else None
            self._remember(("aer", None), lineno)
            extra: dict[str, Any] = {"aer": level}
            if dev_pci is not None and source is not None and source != dev_pci:
                extra["reported_by"] = dev_pci
            return [self._aer_event(lineno, prefix, source or dev_pci, level, extra)]
        detail = AER_DETAIL_RE.search(msg)
        if detail is None or self._fold(("aer", None), lineno, _FOLD_WINDOW):
            return []
        extra = {"aer": detail.group(1).strip()}
        if detail.group(2):
            extra["type"] = detail.group(2).strip()
        if device is not None:
            extra["driver"] = device.group(1)
        return [self._aer_event(lineno, prefix, dev_pci, detail.group(1), extra)]

    def _aer_event(
        self, lineno: int, prefix: Prefix, pci: str | None, level: str, extra: dict[str, Any]
    ) -> KernelEvent:
        lowered = level.lower()
        if "non-fatal" in lowered:
            severity = "error"
        elif "fatal" in lowered:
            severity = "critical"
        elif "uncorrect" in lowered:
            severity = "error"
        else:
            severity = "info"
        return self._event(lineno, prefix, Kind.PCIE_AER, pci=pci, severity=severity, extra=extra)

    # --- host -----------------------------------------------------------------------------------

    def _oom(self, msg: str, lineno: int, prefix: Prefix) -> list[KernelEvent]:
        kill = OOM_KILL_RE.search(msg)
        if kill is not None:
            fields = dict(part.split("=", 1) for part in kill.group(1).split(",") if "=" in part)
            pid = to_int(fields.get("pid"))
            self._remember(("oom", pid), lineno)
            extra: dict[str, Any] = {
                k: fields[k] for k in ("constraint", "oom_memcg", "task_memcg", "uid") if k in fields
            }
            return [
                self._event(
                    lineno, prefix, Kind.OOM_KILL, pid=pid, process=fields.get("task"),
                    severity="error", extra=extra,
                )
            ]  # fmt: skip
        killed = OOM_KILLED_RE.search(msg)
        if killed is None:
            return []
        pid = int(killed.group(2))
        if self._fold(("oom", pid), lineno, _FOLD_WINDOW):
            return []
        cgroup: dict[str, Any] = {"cgroup": True} if killed.group(1) == "Memory cgroup o" else {}
        return [
            self._event(
                lineno,
                prefix,
                Kind.OOM_KILL,
                pid=pid,
                process=killed.group(3),
                severity="error",
                extra=cgroup,
            )
        ]

    def _hung(self, msg: str, lineno: int, prefix: Prefix) -> list[KernelEvent]:
        match = HUNG_RE.search(msg)
        if match is None:
            return []
        return [
            self._event(
                lineno, prefix, Kind.HUNG_TASK, pid=int(match.group(2)), process=match.group(1),
                severity="warning", extra={"blocked_s": int(match.group(3))},
            )
        ]  # fmt: skip

    def _link(self, msg: str, lineno: int, prefix: Prefix) -> list[KernelEvent]:
        lowered = msg.lower()
        if "mlx" not in lowered and IB_IFACE_RE.search(msg) is None:
            return []  # only InfiniBand / RoCE links; other NICs are not the training fabric
        if LINK_DOWN_RE.search(msg) is None:
            return []
        if "port module event" in lowered and not ("error" in lowered or "unplugged" in lowered):
            return []  # "Cable plugged" and other benign module events
        device = DEVICE_RE.match(msg)
        iface = IFACE_RE.search(msg)
        extra: dict[str, Any] = {}
        if device is not None:
            extra["driver"] = device.group(1)
        if iface is not None:
            extra["interface"] = iface.group(1)
        pci = normalize_pci(device.group(2)) if device else None
        return [self._event(lineno, prefix, Kind.IB_LINK, pci=pci, severity="error", extra=extra)]


def parse_lines(lines: Iterable[str], parser: KmsgParser | None = None) -> Iterator[KernelEvent]:
    """Parse an iterable of lines (numbered from 1) and yield every event, then flush."""
    parser = parser or KmsgParser()
    feed = parser.feed
    candidate = is_candidate
    for lineno, line in enumerate(lines, 1):
        if candidate(line):
            yield from feed(line, lineno)
    yield from parser.flush()
