"""Line prefixes of the kernel log: peel them off a line, keep what they said (time, sequence).

What: :func:`strip_prefix` and the regular expressions behind it. The shapes understood: raw
``/dev/kmsg`` records (``PRI,SEQ,TS_USEC,FLAGS;msg``; continuation lines that start with a space are
``KEY=value`` dictionary entries, matched by :data:`DICT_RE` and skipped by the parser), ``dmesg``
(``[12345.678901] msg``), ``dmesg -T`` (``[Mon Dec  9 12:34:44 2024] msg``), syslog
(``Dec  9 12:34:44 host kernel: [ 123.456] msg``), ``journalctl -k`` (``Dec 09 12:34:44 host
kernel: msg``), ``dmesg --time-format iso`` (optionally with the ``kern  :err   :`` prefix of
``dmesg -x``) and caller tags (``[ T1946]``, ``[    C3]``). Prefixes are peeled in that order, each
optional, so combinations (syslog + dmesg timestamp + caller tag) work too.

Why apart: the prefix grammar is written once, as one regular expression, and is the same for every
kind of event; the message patterns (:mod:`ftd.agent.kmsg_parse.patterns`) only see what is left.
"""

from __future__ import annotations

import re
from datetime import datetime

import msgspec

__all__ = ["BRACKET_PREFIX_RE", "DICT_RE", "PREFIX_RE", "Prefix", "strip_prefix"]

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
PREFIX_RE = re.compile(
    f"(?:{_RAW}|(?:{_SYSLOG})?(?:{_LEVEL})?(?:{_ISO})?)(?:{_MONO}|{_CTIME})?(?:{_CALLER})?"
)
BRACKET_PREFIX_RE = re.compile(f"(?:{_MONO}|{_CTIME})?(?:{_CALLER})?")
DICT_RE = re.compile(r" [A-Z_]+=")


class Prefix(msgspec.Struct):
    message: str
    ts: float | None = None
    seq: int | None = None
    time: str | None = None  # wall-clock time as printed (dmesg -T, iso, syslog)


def _prefix_match(line: str) -> re.Match[str]:
    """The prefix of ``line`` (always matches, possibly empty)."""
    match = (BRACKET_PREFIX_RE if line[:1] == "[" else PREFIX_RE).match(line)
    assert match is not None  # every part is optional
    return match


def strip_prefix(line: str) -> Prefix:
    """Peel every known prefix off ``line``; return the bare message and what the prefixes said."""
    match = _prefix_match(line)
    out = Prefix(message=line[match.end() :].rstrip("\r\n"))
    if match.end() == 0:
        return out
    if match.re is BRACKET_PREFIX_RE:
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
