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

__all__ = ["is_candidate", "nvlink5", "pid_name", "recovery_action", "to_int"]

XID_RE = re.compile(
    r"\bXid \((?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
    r"|[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\):\s*(\d+)\s*(?:,\s*)?(.*)"
)
SXID_RE = re.compile(
    r"\b(nvidia-nvswitch\d*)?:?\s*SXid \((?:PCI:)?([0-9a-fA-F:.]+)\):\s*(\d+)\s*(?:,\s*)?(.*)"
)
SXID_DETAIL_RE = re.compile(r"Severity (\d+) Engine instance (\d+) Sub-engine instance (\d+)")
SXID_WORD_RE = re.compile(r"(?i)\s*(?:non-?fatal|fatal)\s*,?\s*")
NVLINK5_RE = re.compile(
    r"(?i)^\s*(?P<unit>[A-Z][A-Z0-9_]*)\s+(?P<sev>non-?fatal|fatal)\s+XC\s*(?P<xc>\d+)\s+i\s*(?P<inst>\d+)"
    r"\s+Link\s+(?P<link>\d+)\s*[(\[](?P<words>[^)\]]*)[)\]]"
)
HEX_WORD_RE = re.compile(r"0x[0-9a-fA-F]+")
PID_RE = re.compile(r"\bpid=(?:'?<unknown>'?|(\d+))")
NAME_RE = re.compile(r"\bname=([^,]*)")
CHANNEL_RE = re.compile(r"\b(?:Ch(?:annel)?)\s+(?:0x)?([0-9a-fA-F]+)")
PREVIOUS_RE = re.compile(r"(?i)previous xid(?:\s*\(?(\d+)\)?)?")
RECOVERY_RE = re.compile(r"(?i)recovery action changed from \S+ \(([^)]*)\) to \S+ \(([^)]*)\)")
UUID_LINE_RE = re.compile(r"NVRM: GPU at (?:PCI:)?([0-9a-fA-F:.]+):\s*(GPU-[0-9a-fA-F-]+)")
ANY_PCI_RE = re.compile(r"\b((?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\b")
BANNER_START_RE = re.compile(r"NVRM: The NVIDIA GPU ([0-9a-fA-F:.]+)")
DEVICE_RE = re.compile(r"^(\S+) ([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\b")
AER_RECEIVED_RE = re.compile(
    r"AER: (?:Multiple )?(Corrected|Uncorrected \((?:Non-)?Fatal\)|Uncorrectable|Fatal)"
    r" error(?:s)? (?:received|message received)(?::|\s+from)?\s*(?:id=)?(\S+)?"
)
AER_DETAIL_RE = re.compile(r"PCIe Bus Error: severity=([^,]+)(?:, type=([^,]+))?")
OOM_KILL_RE = re.compile(r"oom-kill:(\S*)")
OOM_KILLED_RE = re.compile(
    r"(?:(Memory cgroup o|O)ut of memory(?: \([^)]*\))?: )?Killed process (\d+) \(([^)]*)\)"
)
HUNG_RE = re.compile(r"INFO: task (.+):(\d+) blocked for more than (\d+) seconds")
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
        or "lost carrier" in line
        or "odule event" in line
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
    match = NVLINK5_RE.match(rest)
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
    return int(text) if text is not None and text.isdigit() else None
