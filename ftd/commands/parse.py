"""``ftd parse kmsg [FILE|-]``: run the kernel-log parser over a saved log and print what it finds.

What: reads FILE (or stdin for ``-`` or no argument) as bytes, decodes each line as UTF-8 with
replacement (kernel logs do contain junk), and prints one compact JSON object per recognised kernel
event with the docs/architecture.md §9 keys ``line kind code pci pid process action severity`` (always
present, ``null`` when unknown), then ``message`` and ``uuid``, plus ``seq``/``ts``/``extra`` when known. Exit
0; a missing or unreadable FILE is reported on stderr with exit 2.

Why: operators and scripts use it to check what the agent would have reported for a dmesg/journal
dump from a broken node, and the benchmarks rely on its stable output.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import IO, Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "parse",
        help="parse logs the way the agent does",
        description="Parse saved logs the way the agent does and print the events found.",
    )
    sub = parser.add_subparsers(dest="parse_what", metavar="WHAT")
    kmsg = sub.add_parser(
        "kmsg",
        help="kernel log (dmesg, journalctl -k, syslog, /dev/kmsg dump) -> JSON lines",
        description="Print one JSON object per recognised kernel event (Xid, SXid, AER, OOM, ...).",
    )
    kmsg.add_argument(
        "file", nargs="?", default="-", metavar="FILE", help="log file, or - for stdin (default)"
    )
    kmsg.set_defaults(handler=run_kmsg)
    parser.set_defaults(handler=lambda _args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_usage(sys.stderr)
    print("ftd parse: say what to parse, e.g. `ftd parse kmsg dmesg.txt`", file=sys.stderr)
    return 2


def _decoded_lines(stream: IO[bytes]) -> Iterator[str]:
    for raw in stream:
        yield raw.decode("utf-8", errors="replace")


def run_kmsg(args: argparse.Namespace) -> int:
    import msgspec

    from ftd.agent.kmsg_parse import KernelEvent, parse_lines

    encoder = msgspec.json.Encoder()
    write = sys.stdout.write

    def emit_all(stream: IO[bytes]) -> None:
        for event in parse_lines(_decoded_lines(stream)):
            write(encoder.encode(_as_dict(event)).decode() + "\n")

    def _as_dict(event: KernelEvent) -> dict[str, Any]:
        out: dict[str, Any] = {
            "line": event.line,
            "kind": event.kind.value,
            "code": event.code,
            "pci": event.pci,
            "pid": event.pid,
            "process": event.process,
            "action": event.action,
            "severity": event.severity,
            "message": event.message,
            "uuid": event.uuid,
        }
        if event.seq is not None:
            out["seq"] = event.seq
        if event.ts is not None:
            out["ts"] = event.ts
        if event.extra:
            out["extra"] = event.extra
        return out

    if args.file == "-":
        emit_all(sys.stdin.buffer)
    else:
        try:
            stream = open(args.file, "rb")  # noqa: SIM115 - closed below
        except OSError as exc:
            print(f"ftd parse kmsg: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        with stream:
            emit_all(stream)
    sys.stdout.flush()
    return 0
