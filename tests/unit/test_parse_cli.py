"""``ftd parse kmsg``: JSON lines with the docs/architecture.md §9 keys, stdin, bad bytes, missing file."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from ftd.cli import main

LOG = (
    b"[    1.000000] usb 1-1: new high-speed USB device number 2 using xhci_hcd\n"
    b"[   12.345678] NVRM: Xid (PCI:0000:3B:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
    b"\xff\xfe garbage \x00 line\n"
    b"Dec  9 12:34:44 node kernel: [ 13.0] NVRM: Xid (0000:18:00): 13, Graphics Exception\n"
    b"[   14.0] Out of memory: Killed process 77 (python) total-vm:1kB\n"
)
KEYS = {"line", "kind", "code", "pci", "pid", "process", "action", "severity", "message", "uuid"}


def _records(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines()]


def test_parse_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dmesg.txt"
    path.write_bytes(LOG)
    assert main(["parse", "kmsg", str(path)]) == 0
    records = _records(capsys.readouterr().out)
    assert [(r["line"], r["kind"], r["code"], r["pci"]) for r in records] == [
        (2, "xid", 79, "0000:3b:00.0"),
        (4, "xid", 13, "0000:18:00.0"),
        (5, "oom_kill", None, None),
    ]
    assert all(set(r) >= KEYS for r in records)
    assert records[0]["pid"] == 1234 and records[0]["process"] == "python"
    assert records[0]["action"] == "RESTART_BM" and records[0]["severity"] == "critical"
    assert records[2]["pid"] == 77


def test_parse_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(LOG)))
    assert main(["parse", "kmsg", "-"]) == 0
    assert len(_records(capsys.readouterr().out)) == 3


def test_parse_no_events(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "quiet.txt"
    path.write_bytes(b"hello\nworld\n")
    assert main(["parse", "kmsg", str(path)]) == 0
    assert capsys.readouterr().out == ""


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["parse", "kmsg", str(tmp_path / "nope.txt")]) == 2
    captured = capsys.readouterr()
    assert "nope.txt" in captured.err and captured.out == ""
