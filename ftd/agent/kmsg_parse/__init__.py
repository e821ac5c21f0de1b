"""Pure kernel-log parser: text lines in, :class:`KernelEvent` out. No I/O, never raises.

Layout: :mod:`ftd.agent.kmsg_parse.parser` (the stateful :class:`KmsgParser`: dispatch, folding of
multi-line incidents, the cache of parsed Xid messages), :mod:`ftd.agent.kmsg_parse.prefix` (the
line prefixes: timestamps, sequence numbers, syslog and journal headers) and
:mod:`ftd.agent.kmsg_parse.patterns` (the message formats and the Xid detail decoders). This face
re-exports what the kmsg watcher, ``ftd parse``, the benchmarks and the tests import.
"""

from __future__ import annotations

from ftd.agent.kmsg_parse.parser import KernelEvent, KmsgParser, Template, parse_lines
from ftd.agent.kmsg_parse.patterns import is_candidate
from ftd.agent.kmsg_parse.prefix import strip_prefix

__all__ = ["KernelEvent", "KmsgParser", "Template", "is_candidate", "parse_lines", "strip_prefix"]
