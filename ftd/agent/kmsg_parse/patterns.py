"""What each kernel message the parser knows looks like, and the decoders of an Xid's details.

What: the message regular expressions (NVIDIA Xid in every driver era, NVSwitch SXid, the fall-off
banner, the ``NVRM: GPU at PCI:... GPU-<uuid>`` line, PCIe AER, the OOM killer, hung tasks, mlx5/IPoIB
link down), :func:`is_candidate` (the cheap substring pre-filter every line goes through first: almost
every kernel line is noise, and regular expressions only run on lines that pass it), and the pure
helpers that decode an Xid's tail: pid and process name, the recovery action Xid 154 announces
("... to 0x2 (Node Reboot Required)" becomes the event's ``action``) and the NVLink5 fields of Xid
144-150. Why apart: these are the facts about driver and kernel message formats, which change with
driver releases; the parser's state (folding, banners, the template cache) does not.
"""

from __future__ import annotations

import re
from typing import Any

from ftd.agent.kmsg_parse.families import family_candidate
from ftd.pci import normalize_pci

__all__ = ["is_candidate", "nvlink5", "pid_name", "recovery_action", "to_int", "xid_address", "xid_details"]

# Linear time, always: every pattern here runs on every candidate line, and a line can be 64 KiB
# (the parser's cut). So no unbounded repeat is followed by something that can fail far away
# (``[^)]*\)`` on a line with no ``)`` rescans the rest of the line from every start: quadratic);
# free-text fields are bounded (``{0,64}``) and nothing repeats inside a repeat.
# tests/unit/test_kmsg_linear.py times every compiled pattern of this package on 64 KiB
# adversarial lines. A pattern must be a module-level constant (or in a module-level table) for
# that test to find it: no regular expressions written inline in functions.

# Every form NVIDIA drivers have printed (docs/signals.md "Xid line formats"):
#   NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., ...      R450 and later (domain, PCI: prefix)
#   NVRM: Xid (0000:3b:00): 13, ...                              without the PCI: prefix
#   NVRM: Xid (PCI:3b:00.0): 13, ...   NVRM: Xid (3b:00): 13     without the domain
#   NVRM: Xid (0001:00): 13, 0000 01019700 ...                   2000s drivers: bus (%04x) and device
#   NVRM: Xid: 13, 0000 02005600 00000056 ...                    older still: no address at all
#   NVRM: Xid (PCI:0000:XX:00): 79, ...                          an address redacted in a bug report
# The address is any text without parentheses (read by :func:`xid_address`); the code is the first
# number after the closing parenthesis (never "the first number after Xid": that is the domain).
XID_RE = re.compile(
    r"\bXid(?: \((?:PCI:)?([^()]{1,40})\))?:[ \t]{0,8}(\d{1,9})\b[ \t]{0,8}(?:,[ \t]{0,8})?(.*)"
)
SXID_RE = re.compile(
    r"\b(nvidia-nvswitch\d{0,4})?:?[ \t]{0,8}SXid \((?:PCI:)?([0-9a-fA-F:.]{1,40})\):[ \t]{0,8}(\d{1,9})\b"
    r"[ \t]{0,8}(?:,[ \t]{0,8})?(.*)"
)
OLD_XID_ADDRESS_RE = re.compile(r"([0-9a-fA-F]{4}):([0-9a-fA-F]{2})")  # 2000s drivers: "(0001:00)"
# A redacted address: hex digits and separators with masked digits (0000:XX:00, xxxx:xx:xx.x, **:00;
# :func:`xid_address` checks a mask is there), or the word (<redacted>, REDACTED).
REDACTED_ADDRESS_RE = re.compile(r"(?i)<?redacted>?|[0-9a-fx*#?:.\u2026]{1,40}")
_MASKS = frozenset("xX*#?\u2026")
GPC_RE = re.compile(r"\(GPC (\d{1,3}), TPC (\d{1,3}), SM (\d{1,3})\)")  # Xid 13: where the SM fault was
NVLINK_ERROR_RE = re.compile(r"\bon link (\d{1,3}) ?\(([^()]{0,200})\)")  # Xid 74: link and registers
SXID_LINK_RE = re.compile(r"\bLink (\d{1,3})")
FATAL_WORD_RE = re.compile(r"(?<![-\w])fatal\b")
LINK_WORD_RE = re.compile(r"\bLink\s{1,4}(-?\d{1,3})")
SXID_DETAIL_RE = re.compile(r"Severity (\d{1,3}) Engine instance (\d{1,6}) Sub-engine instance (\d{1,6})")
SXID_DATA_RE = re.compile(r"Data ?\{")  # the register dump line that follows an SXid's header
SXID_WORD_RE = re.compile(r"(?i)\s{0,8}(?:non-?fatal|fatal)\s{0,8},?\s{0,8}")
NVLINK5_RE = re.compile(
    r"(?i)^\s{0,8}(?P<unit>[A-Z][A-Z0-9_/]{0,63})\s{1,8}(?P<sev>non-?fatal|fatal)\s{1,8}XC\s{0,4}(?P<xc>\d{1,4})"
    r"\s{1,4}i\s{0,4}(?P<inst>\d{1,4})\s{1,4}Link\s{1,4}(?P<link>-?\d{1,4})\s{0,4}[(\[](?P<words>[^)\]]{0,200})[)\]]"
)
# The pid= and name= an NVLink5 Xid may carry before its unit ("145, pid=1, name=x, RLW_RXPIPE ...").
NVLINK5_LEAD_RE = re.compile(r"(?:pid=[^,]{0,32},\s{0,4})?(?:name=[^,]{0,64},\s{0,4})?")
HEX_WORD_RE = re.compile(r"0x[0-9a-fA-F]{1,16}")
PID_RE = re.compile(r"\bpid=(?:'?<unknown>'?|(\d{1,10}))")
NAME_RE = re.compile(r"\bname=([^,]{0,64})")
CHANNEL_RE = re.compile(r"\b(?:Ch(?:annel)?)\s{1,4}(?:0x)?([0-9a-fA-F]{1,16})")
PREVIOUS_RE = re.compile(r"(?i)previous xid(?:\s{0,4}\(?(\d{1,9})\)?)?")
RECOVERY_RE = re.compile(
    r"(?i)recovery action changed from \S{1,20} \(([^()]{0,64})\) to \S{1,20} \(([^()]{0,64})\)"
)
UUID_LINE_RE = re.compile(r"NVRM: GPU at (?:PCI:)?([0-9a-fA-F:.]{1,40}):\s{0,4}(GPU-[0-9a-fA-F-]{1,64})")
ANY_PCI_RE = re.compile(r"\b((?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\b")
BANNER_START_RE = re.compile(r"NVRM: The NVIDIA GPU ([0-9a-fA-F:.]{1,40})")
DEVICE_RE = re.compile(r"^(\S{1,64}) ([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\b")
AER_RECEIVED_RE = re.compile(
    r"AER: (?:Multiple )?(Corrected|Uncorrected \((?:Non-)?Fatal\)|Uncorrectable|Fatal)"
    r" error(?:s)? (?:received|message received)(?::|\s{1,4}from)?\s{0,4}(?:id=)?(\S{1,64})?"
)
AER_DETAIL_RE = re.compile(r"PCIe Bus Error: severity=([^,]{1,64})(?:, type=([^,]{1,64}))?")
OOM_KILL_RE = re.compile(r"oom-kill:(\S{0,4096})")
OOM_KILLED_RE = re.compile(
    r"(?:(Memory cgroup o|O)ut of memory(?: \([^()]{0,64}\))?: )?Killed process (\d{1,10}) \(([^()]{0,64})\)"
)
# "INFO: task NAME:PID blocked for more than N seconds." (older kernels and some peers' tests drop the
# "INFO: " and write "20s"); NAME is a kernel comm (at most 15 bytes, may hold spaces and colons).
HUNG_RE = re.compile(r"\btask (.{1,64}?):(\d{1,10}) blocked for more than (\d{1,10}) ?s(?:econds)?\b")
LINK_DOWN_RE = re.compile(r"(?i)\blink (?:is )?down\b|lost carrier|port module event")
IB_IFACE_RE = re.compile(r"\bib[a-z0-9_]*\d\b")
IFACE_RE = re.compile(r"\b(ib[a-z0-9_]*\d|en[a-z0-9]+|eth\d+)\b:")

_RECOVERY_ACTIONS = {
    "none": "IGNORE",
    "drain p2p": "RESET_GPU",
    "drain and reset": "RESET_GPU",
    "gpu reset required": "RESET_GPU",
    "node reboot required": "RESTART_BM",
}
_BUCKET_SEVERITY = {"IGNORE": "info", "RESET_GPU": "critical", "RESTART_BM": "critical"}


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
        or "ost carrier" in line  # lost carrier, Lost carrier
        or "odule event" in line
        or family_candidate(line)
    )


def pid_name(rest: str) -> tuple[int | None, str | None]:
    pid_match = PID_RE.search(rest)
    pid = int(pid_match.group(1)) if pid_match is not None and pid_match.group(1) else None
    name_match = NAME_RE.search(rest)
    process = name_match.group(1).strip().strip("'\"") if name_match is not None else None
    if process in ("", "<unknown>"):
        process = None
    return pid, process


def recovery_action(rest: str, extra: dict[str, Any], action: str, severity: str) -> tuple[str, str]:
    match = RECOVERY_RE.search(rest)
    if match is None:
        return action, severity
    extra["recovery_from"] = match.group(1)
    extra["recovery_to"] = match.group(2)
    bucket = _RECOVERY_ACTIONS.get(match.group(2).strip().lower())
    if bucket is None:
        return action, severity
    return bucket, _BUCKET_SEVERITY.get(bucket, severity)


def nvlink5(code: int, rest: str, extra: dict[str, Any], severity: str) -> str:
    """Decode an NVLink5 Xid (144-150): ``UNIT Fatal|Nonfatal XC<n> i<n> Link <n> (0x.. 0x.. ...)``
    (R575 and later) or ``... XC 1 i 2 Link 01 [0x..]`` (earlier). Adds ``nvlink5_unit``, ``fatal``,
    ``link``, ``xc``, ``instance``, ``intr_info`` and ``error_status`` (the first two register
    words, as printed), ``sub_code`` (bits 20-25 of the interrupt info: the row of NVIDIA's Xid
    144-150 table) and ``registers``. Returns the event severity: Xid 150 or Fatal: critical;
    Nonfatal: warning; not decoded: as the catalog says (``fatal`` from the words when present)."""
    lead = NVLINK5_LEAD_RE.match(rest)
    match = NVLINK5_RE.match(rest[lead.end() :] if lead is not None else rest)
    if match is None:
        lowered = rest.lower()
        if "nonfatal" in lowered or "non-fatal" in lowered:
            extra["fatal"] = False
        elif FATAL_WORD_RE.search(lowered):
            extra["fatal"] = True
        link = LINK_WORD_RE.search(rest)
        if link is not None:
            extra["link"] = int(link.group(1))
        if code == 150:
            extra["fatal"] = True
        fatal = extra.get("fatal")
        return "critical" if fatal is True else "warning" if fatal is False else severity
    fatal = code == 150 or match.group("sev").lower() == "fatal"
    words = HEX_WORD_RE.findall(match.group("words"))
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


def to_int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdecimal() else None


def xid_address(text: str | None, extra: dict[str, Any]) -> str | None:
    """The canonical PCI address of an Xid line's parenthesised address ``text`` (None: the line
    had none, the ``NVRM: Xid: 13, ...`` form). The 2000s form ``0001:00`` is bus (printed with four
    digits) and device. An address that cannot be read (redacted in a bug report: ``0000:XX:00``,
    ``<redacted>``; or anything else) gives None and keeps the text as ``extra["address"]``, with
    ``extra["address_redacted"]`` when it looks redacted: the code is still the driver's report."""
    if text is None:
        return None
    pci = normalize_pci(text)
    if pci is not None:
        return pci
    old = OLD_XID_ADDRESS_RE.fullmatch(text)
    if old is not None and int(old.group(1), 16) <= 0xFF:
        return f"0000:{int(old.group(1), 16):02x}:{old.group(2).lower()}.0"
    extra["address"] = text
    if REDACTED_ADDRESS_RE.fullmatch(text) and (not _MASKS.isdisjoint(text) or "redact" in text.lower()):
        extra["address_redacted"] = True
    return None


def xid_details(code: int, rest: str, extra: dict[str, Any]) -> None:
    """Code-specific details of an Xid's tail: where an Xid 13 fault was (``gpc``, ``tpc``,
    ``sm``), which NVLink an Xid 74 names and its register words (``link``, ``registers``)."""
    if code == 13:
        where = GPC_RE.search(rest)
        if where is not None:
            extra.update(gpc=int(where.group(1)), tpc=int(where.group(2)), sm=int(where.group(3)))
    elif code == 74:
        link = NVLINK_ERROR_RE.search(rest)
        if link is not None:
            extra["link"] = int(link.group(1))
            extra["registers"] = [w.lower() for w in HEX_WORD_RE.findall(link.group(2))]
