"""Pure kernel-log parser: text lines in, :class:`KernelEvent` out. No I/O, never raises.

What it understands (DESIGN §5 "kmsg"):

* **Line shapes**: raw ``/dev/kmsg`` records (``PRI,SEQ,TS_USEC,FLAGS;msg``; continuation lines that
  start with a space are ``KEY=value`` dictionary entries and are skipped), ``dmesg``
  (``[12345.678901] msg``), ``dmesg -T`` (``[Mon Dec  9 12:34:44 2024] msg``), syslog
  (``Dec  9 12:34:44 host kernel: [ 123.456] msg``), ``journalctl -k`` (``Dec 09 12:34:44 host
  kernel: msg``), ``dmesg --time-format iso`` (optionally with the ``kern  :err   :`` prefix of
  ``dmesg -x``) and caller tags (``[ T1946]``, ``[    C3]``). Prefixes are peeled in that order,
  each optional, so combinations (syslog + dmesg timestamp + caller tag) work too.
* **Events**: NVIDIA Xid in every driver era (with or without ``PCI:``, with ``pid=``/``name=`` or
  ``Ch``/``Channel``, ``pid='<unknown>'``), NVSwitch SXid, the "GPU has fallen off the bus" banner
  (single-line and the older three-line form), the ``NVRM: GPU at PCI:... GPU-<uuid>`` line (kept as a
  PCI -> UUID map attached to later events), PCIe AER, the OOM killer, hung tasks and mlx5/IPoIB link
  down.

The Xid code is the first number *after the closing parenthesis* of the device address, never "the
first number after Xid" (that is the PCI domain). Xid 154 also carries the driver's recovery action
in text ("... to 0x2 (Node Reboot Required)"); it becomes the event's ``action``.

Speed: almost every kernel line is noise, so each line first goes through a handful of substring
tests (``'Xid' in line`` ...); regular expressions only run on lines that pass. Prefixes are parsed
only for those candidate lines as well, by one regular expression (the prefix grammar above, written
once).

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

import re
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

import msgspec

from ftd.catalog import XidCatalog, load_xid_catalog
from ftd.events import Kind
from ftd.pci import normalize_pci

__all__ = ["KernelEvent", "KmsgParser", "Template", "is_candidate", "parse_lines", "strip_prefix"]


class KernelEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One recognised kernel event (DESIGN §9 keys plus context)."""

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


# --- prefixes -----------------------------------------------------------------------------------

_ISO_TS = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"  # dmesg/journal ISO time
_RAW = r"(?P<pri>\d{1,3}),(?P<seq>\d+),(?P<usec>\d+),[^;]*;"  # /dev/kmsg: PRI,SEQ,TS_USEC,FLAGS;
_SYSLOG = (
    r"(?P<syslog>[A-Z][a-z]{2} [ \d]?\d \d\d:\d\d:\d\d(?:\.\d+)?|" + _ISO_TS + r") \S+ kernel(?:\[\d+\])?: ?"
)
_LEVEL = r"[a-z]{2,8} *:[a-z]{3,6} *: ?"  # dmesg -x: "kern  :err   : "
_ISO = r"(?P<iso>" + _ISO_TS + r")\s+"
_MONO = r"\[ *(?P<mono>\d+\.\d+)\] ?"
_CTIME = r"\[(?P<ctime>[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})\] ?"
_CALLER = r"\[ *[TC]\d+\] ?"
# Every part is optional and tried in this order: a raw record header, or else syslog, dmesg -x level
# and ISO time (each optional); then a monotonic or a ctime timestamp; then a caller tag. Since the
# rest can always match empty, the engine never backtracks into an earlier part: it is the same as
# peeling the parts one by one. No part but the last two can start with "[", so a line that does
# (plain dmesg, the common case) is matched by the short form.
_PREFIX_RE = re.compile(
    f"(?:{_RAW}|(?:{_SYSLOG})?(?:{_LEVEL})?(?:{_ISO})?)(?:{_MONO}|{_CTIME})?(?:{_CALLER})?"
)
_BRACKET_PREFIX_RE = re.compile(f"(?:{_MONO}|{_CTIME})?(?:{_CALLER})?")
_DICT_RE = re.compile(r" [A-Z_]+=")


class _Prefix(msgspec.Struct):
    message: str
    ts: float | None = None
    seq: int | None = None
    time: str | None = None  # wall-clock time as printed (dmesg -T, iso, syslog)


def _prefix_match(line: str) -> re.Match[str]:
    """The prefix of ``line`` (always matches, possibly empty)."""
    match = (_BRACKET_PREFIX_RE if line[:1] == "[" else _PREFIX_RE).match(line)
    assert match is not None  # every part is optional
    return match


def strip_prefix(line: str) -> _Prefix:
    """Peel every known prefix off ``line``; return the bare message and what the prefixes said."""
    match = _prefix_match(line)
    out = _Prefix(message=line[match.end() :].rstrip("\r\n"))
    if match.end() == 0:
        return out
    if match.re is _BRACKET_PREFIX_RE:
        seq = usec = syslog = iso = None
        mono, ctime = match.group("mono", "ctime")
    else:
        seq, usec, syslog, iso, mono, ctime = match.group("seq", "usec", "syslog", "iso", "mono", "ctime")
    if seq is not None and usec is not None:  # both or neither: one part of the pattern
        out.seq = int(seq)
        out.ts = int(usec) / 1e6
    if mono is not None:
        out.ts = float(mono)
    if ctime is not None:
        out.time = _ctime_to_iso(ctime)
    elif iso is not None:
        out.time = iso
    elif syslog is not None:
        out.time = syslog
    return out


def _ctime_to_iso(text: str) -> str:
    try:
        return datetime.strptime(" ".join(text.split()), "%a %b %d %H:%M:%S %Y").isoformat()
    except ValueError:
        return text


# --- message patterns ---------------------------------------------------------------------------

_XID_RE = re.compile(
    r"\bXid \((?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
    r"|[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\):\s*(\d+)\s*(?:,\s*)?(.*)"
)
_SXID_RE = re.compile(
    r"\b(nvidia-nvswitch\d*)?:?\s*SXid \((?:PCI:)?([0-9a-fA-F:.]+)\):\s*(\d+)\s*(?:,\s*)?(.*)"
)
_SXID_DETAIL_RE = re.compile(r"Severity (\d+) Engine instance (\d+) Sub-engine instance (\d+)")
_SXID_WORD_RE = re.compile(r"(?i)\s*(?:non-?fatal|fatal)\s*,?\s*")
_NVLINK5_RE = re.compile(
    r"(?i)^\s*(?P<unit>[A-Z][A-Z0-9_]*)\s+(?P<sev>non-?fatal|fatal)\s+XC\s*(?P<xc>\d+)\s+i\s*(?P<inst>\d+)"
    r"\s+Link\s+(?P<link>\d+)\s*[(\[](?P<words>[^)\]]*)[)\]]"
)
_HEX_WORD_RE = re.compile(r"0x[0-9a-fA-F]+")
_PID_RE = re.compile(r"\bpid=(?:'?<unknown>'?|(\d+))")
_NAME_RE = re.compile(r"\bname=([^,]*)")
_CHANNEL_RE = re.compile(r"\b(?:Ch(?:annel)?)\s+(?:0x)?([0-9a-fA-F]+)")
_PREVIOUS_RE = re.compile(r"(?i)previous xid(?:\s*\(?(\d+)\)?)?")
_RECOVERY_RE = re.compile(r"(?i)recovery action changed from \S+ \(([^)]*)\) to \S+ \(([^)]*)\)")
_UUID_LINE_RE = re.compile(r"NVRM: GPU at (?:PCI:)?([0-9a-fA-F:.]+):\s*(GPU-[0-9a-fA-F-]+)")
_ANY_PCI_RE = re.compile(r"\b((?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\b")
_BANNER_START_RE = re.compile(r"NVRM: The NVIDIA GPU ([0-9a-fA-F:.]+)")
_DEVICE_RE = re.compile(r"^(\S+) ([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\b")
_AER_RECEIVED_RE = re.compile(
    r"AER: (?:Multiple )?(Corrected|Uncorrected \((?:Non-)?Fatal\)|Uncorrectable|Fatal)"
    r" error(?:s)? (?:received|message received)(?::|\s+from)?\s*(?:id=)?(\S+)?"
)
_AER_DETAIL_RE = re.compile(r"PCIe Bus Error: severity=([^,]+)(?:, type=([^,]+))?")
_OOM_KILL_RE = re.compile(r"oom-kill:(\S*)")
_OOM_KILLED_RE = re.compile(
    r"(?:(Memory cgroup o|O)ut of memory(?: \([^)]*\))?: )?Killed process (\d+) \(([^)]*)\)"
)
_HUNG_RE = re.compile(r"INFO: task (.+):(\d+) blocked for more than (\d+) seconds")
_LINK_DOWN_RE = re.compile(r"(?i)\blink (?:is )?down\b|lost carrier|port module event")
_IB_IFACE_RE = re.compile(r"\bib[a-z0-9_]*\d\b")
_IFACE_RE = re.compile(r"\b(ib[a-z0-9_]*\d|en[a-z0-9]+|eth\d+)\b:")

_RECOVERY_ACTIONS = {
    "none": "IGNORE",
    "drain p2p": "RESET_GPU",
    "drain and reset": "RESET_GPU",
    "gpu reset required": "RESET_GPU",
    "node reboot required": "RESTART_BM",
}
_BUCKET_SEVERITY = {"IGNORE": "info", "RESET_GPU": "critical", "RESTART_BM": "critical"}
_FOLD_WINDOW = 5  # lines within which a detail line is folded into its header event
_BANNER_WINDOW = 8  # lines within which the three-line fall-off banner must complete
_XID79_WINDOW = 50  # lines after an Xid 79 within which "fallen off the bus" is the same incident
_SXID_WINDOW = 20  # lines after an SXid header within which its detail lines are folded into it


def is_candidate(line: str) -> bool:
    """Cheap pre-filter: can this line possibly be an event? (substring tests only)"""
    return (
        "Xid" in line
        or "NVRM" in line
        or "AER" in line
        or "PCIe Bus Error" in line
        or "oom-kill" in line
        or "Killed process" in line
        or "blocked for more than" in line
        or ("ink" in line and ("own" in line or "OWN" in line))  # link (is) down, Link Down
        or "lost carrier" in line
        or "odule event" in line
    )


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
        self._banner: tuple[int, str | None, _Prefix] | None = None  # (line, pci, prefix)
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
        prefix = (_BRACKET_PREFIX_RE if line[:1] == "[" else _PREFIX_RE).match(line)
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
        if line[:1] == " " and _DICT_RE.match(line):
            return []  # /dev/kmsg dictionary continuation line (KEY=value)
        if len(line) > _MAX_LINE:
            line = line[:_MAX_LINE]
        prefix = strip_prefix(line)
        msg = prefix.message
        if "SXid" in msg:
            sxid = self._sxid(msg, lineno, prefix)
            if sxid is not None:
                return sxid
        elif "Xid" in msg:
            event = self._xid(msg, lineno, prefix)
            if event is not None:
                if event.kind in _CACHED_KINDS:
                    self._keep(msg, event)
                return [event]
        if "NVRM" in msg:
            return self._nvrm(msg, lineno, prefix)
        if "AER" in msg or "PCIe Bus Error" in msg:
            return self._aer(msg, lineno, prefix)
        if "oom-kill" in msg or "Killed process" in msg:
            return self._oom(msg, lineno, prefix)
        if "blocked for more than" in msg:
            return self._hung(msg, lineno, prefix)
        return self._link(msg, lineno, prefix)

    def _event(self, lineno: int, prefix: _Prefix, kind: Kind, **fields: Any) -> KernelEvent:
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

    # --- NVIDIA ---------------------------------------------------------------------------------

    def _xid(self, msg: str, lineno: int, prefix: _Prefix) -> KernelEvent | None:
        match = _XID_RE.search(msg)
        if match is None:
            return None
        pci = normalize_pci(match.group(1))
        code = int(match.group(2))
        rest = match.group(3)
        info = self._catalog.get(code)
        extra: dict[str, Any] = {"name": info.name}
        if not info.known:
            extra["unknown_code"] = True
        action, severity = info.action, info.severity
        pid, process = _pid_name(rest)
        channel = _CHANNEL_RE.search(rest)
        if channel is not None:
            extra["channel"] = channel.group(1).lower()
        previous = _PREVIOUS_RE.search(rest)
        if previous is not None:
            extra["caused_by_previous"] = int(previous.group(1)) if previous.group(1) else True
        if code == 154:
            action, severity = _recovery_action(rest, extra, action, severity)
        if 144 <= code <= 150:
            severity = _nvlink5(code, rest, extra, severity)
        if code == 79:
            self._remember(("xid79", pci), lineno)
        return self._event(
            lineno, prefix, Kind.XID, code=code, pci=pci, pid=pid, process=process,
            action=action, severity=severity, extra=extra,
        )  # fmt: skip

    def _sxid(self, msg: str, lineno: int, prefix: _Prefix) -> list[KernelEvent] | None:
        """An NVSwitch SXid: the header line is the event; the driver's two detail lines that follow
        it (``Severity N Engine instance ...`` and ``Data {...}``) are folded into it. A severity line
        without its header (lost from the ring buffer) is an event of its own (``Severity 1``:
        fatal); a data line alone is not. None: not an SXid line after all."""
        match = _SXID_RE.search(msg)
        if match is None:
            return None
        code, pci = int(match.group(3)), normalize_pci(match.group(2))
        rest = match.group(4)
        key = ("sxid", (pci, code))
        extra: dict[str, Any] = {}
        if match.group(1):
            extra["switch"] = match.group(1)
        if rest.startswith("Data {") or rest.startswith("Data{"):
            return []  # raw registers: part of the header's incident, never an event alone
        detail = _SXID_DETAIL_RE.match(rest)
        if detail is not None:
            if self._fold(key, lineno, _SXID_WINDOW):
                return []
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
        word = _SXID_WORD_RE.match(rest)
        if word is not None:
            extra["sxid_severity"] = "fatal" if fatal else "non-fatal"
            extra["detail"] = rest[word.end() :].strip()
        link = re.search(r"\bLink (\d+)", rest)
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

    def _nvrm(self, msg: str, lineno: int, prefix: _Prefix) -> list[KernelEvent]:
        uuid_match = _UUID_LINE_RE.search(msg)
        if uuid_match is not None:
            pci = normalize_pci(uuid_match.group(1))
            if pci is not None:
                self._uuids[pci] = uuid_match.group(2).lower().replace("gpu-", "GPU-", 1)
            return []
        banner = _BANNER_START_RE.search(msg)
        if banner is not None and "fallen off" not in msg:
            self._banner = (lineno, normalize_pci(banner.group(1)), prefix)
            return []
        if "fallen off the bus" not in msg:
            return []
        return self._fallen_off(msg, lineno, prefix)

    def _fallen_off(self, msg: str, lineno: int, prefix: _Prefix) -> list[KernelEvent]:
        first_line, pci = lineno, None
        if self._banner is not None and lineno - self._banner[0] <= _BANNER_WINDOW:
            first_line, pci, prefix = self._banner
        self._banner = None
        if pci is None:
            any_pci = _ANY_PCI_RE.search(msg)
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

    def _aer(self, msg: str, lineno: int, prefix: _Prefix) -> list[KernelEvent]:
        device = _DEVICE_RE.match(msg)
        dev_pci = normalize_pci(device.group(2)) if device else None
        received = _AER_RECEIVED_RE.search(msg)
        if received is not None:
            level = received.group(1)
            source = normalize_pci(received.group(2)) if received.group(2) else None
            self._remember(("aer", None), lineno)
            extra: dict[str, Any] = {"aer": level}
            if dev_pci is not None and source is not None and source != dev_pci:
                extra["reported_by"] = dev_pci
            return [self._aer_event(lineno, prefix, source or dev_pci, level, extra)]
        detail = _AER_DETAIL_RE.search(msg)
        if detail is None or self._fold(("aer", None), lineno, _FOLD_WINDOW):
            return []
        extra = {"aer": detail.group(1).strip()}
        if detail.group(2):
            extra["type"] = detail.group(2).strip()
        if device is not None:
            extra["driver"] = device.group(1)
        return [self._aer_event(lineno, prefix, dev_pci, detail.group(1), extra)]

    def _aer_event(
        self, lineno: int, prefix: _Prefix, pci: str | None, level: str, extra: dict[str, Any]
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

    def _oom(self, msg: str, lineno: int, prefix: _Prefix) -> list[KernelEvent]:
        kill = _OOM_KILL_RE.search(msg)
        if kill is not None:
            fields = dict(part.split("=", 1) for part in kill.group(1).split(",") if "=" in part)
            pid = _to_int(fields.get("pid"))
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
        killed = _OOM_KILLED_RE.search(msg)
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

    def _hung(self, msg: str, lineno: int, prefix: _Prefix) -> list[KernelEvent]:
        match = _HUNG_RE.search(msg)
        if match is None:
            return []
        return [
            self._event(
                lineno, prefix, Kind.HUNG_TASK, pid=int(match.group(2)), process=match.group(1),
                severity="warning", extra={"blocked_s": int(match.group(3))},
            )
        ]  # fmt: skip

    def _link(self, msg: str, lineno: int, prefix: _Prefix) -> list[KernelEvent]:
        lowered = msg.lower()
        if "mlx" not in lowered and _IB_IFACE_RE.search(msg) is None:
            return []  # only InfiniBand / RoCE links; other NICs are not the training fabric
        if _LINK_DOWN_RE.search(msg) is None:
            return []
        if "port module event" in lowered and not ("error" in lowered or "unplugged" in lowered):
            return []  # "Cable plugged" and other benign module events
        device = _DEVICE_RE.match(msg)
        iface = _IFACE_RE.search(msg)
        extra: dict[str, Any] = {}
        if device is not None:
            extra["driver"] = device.group(1)
        if iface is not None:
            extra["interface"] = iface.group(1)
        pci = normalize_pci(device.group(2)) if device else None
        return [self._event(lineno, prefix, Kind.IB_LINK, pci=pci, severity="error", extra=extra)]


def _pid_name(rest: str) -> tuple[int | None, str | None]:
    pid_match = _PID_RE.search(rest)
    pid = int(pid_match.group(1)) if pid_match is not None and pid_match.group(1) else None
    name_match = _NAME_RE.search(rest)
    process = name_match.group(1).strip().strip("'\"") if name_match is not None else None
    if process in ("", "<unknown>"):
        process = None
    return pid, process


def _recovery_action(rest: str, extra: dict[str, Any], action: str, severity: str) -> tuple[str, str]:
    match = _RECOVERY_RE.search(rest)
    if match is None:
        return action, severity
    extra["recovery_from"] = match.group(1)
    extra["recovery_to"] = match.group(2)
    bucket = _RECOVERY_ACTIONS.get(match.group(2).strip().lower())
    if bucket is None:
        return action, severity
    return bucket, _BUCKET_SEVERITY.get(bucket, severity)


def _nvlink5(code: int, rest: str, extra: dict[str, Any], severity: str) -> str:
    """Decode an NVLink5 Xid (144-150): ``UNIT Fatal|Nonfatal XC<n> i<n> Link <n> (0x.. 0x.. ...)``
    (R575 and later) or ``... XC 1 i 2 Link 01 [0x..]`` (earlier). Adds ``nvlink5_unit``, ``fatal``,
    ``link``, ``xc``, ``instance``, ``intr_info`` and ``error_status`` (the first two register
    words, as printed), ``sub_code`` (bits 20-25 of the interrupt info: the row of NVIDIA's Xid
    144-150 table) and ``registers``. Returns the event severity: Xid 150 or Fatal: critical;
    Nonfatal: warning; not decoded: as the catalog says (``fatal`` from the words when present)."""
    match = _NVLINK5_RE.match(rest)
    if match is None:
        lowered = rest.lower()
        if "nonfatal" in lowered or "non-fatal" in lowered:
            extra["fatal"] = False
        elif re.search(r"(?<![-\w])fatal\b", lowered):
            extra["fatal"] = True
        link = re.search(r"\bLink\s+(\d+)", rest)
        if link is not None:
            extra["link"] = int(link.group(1))
        if code == 150:
            extra["fatal"] = True
        fatal = extra.get("fatal")
        return "critical" if fatal is True else "warning" if fatal is False else severity
    fatal = code == 150 or match.group("sev").lower() == "fatal"
    words = _HEX_WORD_RE.findall(match.group("words"))
    extra.update(
        nvlink5_unit=match.group("unit"),
        fatal=fatal,
        link=int(match.group("link")),
        xc=int(match.group("xc")),
        instance=int(match.group("inst")),
        registers=[w.lower() for w in words],
    )
    if words:
        intr_info = int(words[0], 16)
        extra["intr_info"] = words[0].lower()
        extra["sub_code"] = (intr_info >> 20) & 0x3F
    if len(words) > 1:
        extra["error_status"] = words[1].lower()
    return "critical" if fatal else "warning"


def _to_int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def parse_lines(lines: Iterable[str], parser: KmsgParser | None = None) -> Iterator[KernelEvent]:
    """Parse an iterable of lines (numbered from 1) and yield every event, then flush."""
    parser = parser or KmsgParser()
    feed = parser.feed
    candidate = is_candidate
    for lineno, line in enumerate(lines, 1):
        if candidate(line):
            yield from feed(line, lineno)
    yield from parser.flush()
