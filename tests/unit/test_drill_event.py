"""A drill's event is the real fault's (issue #32 item 2): :func:`ftd.agent.local_api.inject.injected_event`
writes the kernel line the driver prints and reads it with the kmsg watcher's parser, so the event has
the severity, catalogue action and fields of the real line, plus ``drill = true``; bad data is a
sentence, never an event."""

from __future__ import annotations

import pytest

from ftd.agent.kmsg_parse import KmsgParser
from ftd.agent.local_api.inject import DrillError, InjectMsg, injected_event
from ftd.agent.watchers.kmsg import kernel_event_to_event
from ftd.events import Event, Kind, Severity

REAL = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus."


def real_event(line: str) -> Event:
    parser = KmsgParser()
    [kev] = [*parser.feed(line, 1), *parser.flush()]
    return kernel_event_to_event("node-1", kev)


def test_an_xid79_drill_has_the_real_lines_severity_and_fields() -> None:
    event = injected_event("node-1", InjectMsg(kind=Kind.XID, data={"code": 79, "pci": "0000:3b:00.0"}))
    real = real_event(REAL)
    assert event.severity == real.severity == Severity.CRITICAL
    for key in ("code", "pci", "action", "catalog_version", "extra"):
        assert event.data[key] == real.data[key], key
    assert event.source == "inject" and event.data["drill"] is True
    assert event.data["kernel_line"].startswith("NVRM: Xid (PCI:0000:3b:00): 79,")


def test_a_drill_may_name_the_kernel_line_itself_and_keeps_its_own_fields() -> None:
    event = injected_event("node-1", InjectMsg(kind=Kind.XID, data={"line": REAL, "ticket": "OPS-1"}))
    assert (event.severity, event.data["code"], event.data["pid"]) == (Severity.CRITICAL, 79, 4242)
    assert event.data["ticket"] == "OPS-1" and event.data["kernel_line"] == REAL


def test_an_xid13_drill_is_an_application_fault_and_a_named_severity_wins() -> None:
    event = injected_event("node-1", InjectMsg(kind=Kind.XID, data={"code": 13}))
    assert (event.severity, event.data["action"]) == (Severity.ERROR, "RESTART_APP")
    loud = injected_event("node-1", InjectMsg(kind=Kind.XID, severity=Severity.CRITICAL, data={"code": 13}))
    assert loud.severity == Severity.CRITICAL


def test_fallen_off_the_bus_and_a_fatal_sxid_are_critical_like_their_lines() -> None:
    off = injected_event("node-1", InjectMsg(kind=Kind.GPU_FALLEN_OFF_BUS, data={"pci": "0000:3b:00.0"}))
    assert (off.severity, off.data["pci"], off.data["drill"]) == (Severity.CRITICAL, "0000:3b:00.0", True)
    fatal = injected_event("node-1", InjectMsg(kind=Kind.SXID, data={"code": 12028, "fatal": True}))
    assert fatal.severity == Severity.CRITICAL and fatal.data["extra"]["fatal"] is True
    mild = injected_event("node-1", InjectMsg(kind=Kind.SXID, data={"code": 12028}))
    assert mild.severity == Severity.WARNING


def test_other_kinds_are_warnings_marked_as_drills() -> None:
    event = injected_event("node-1", InjectMsg(kind=Kind.FS_FILL, data={"path": "/ckpt"}))
    assert (event.severity, event.data) == (Severity.WARNING, {"path": "/ckpt", "drill": True})


@pytest.mark.parametrize(
    ("kind", "data", "says"),
    [
        (Kind.XID, {}, "needs data.code"),
        (Kind.XID, {"code": "79"}, "needs data.code"),
        (Kind.XID, {"code": 79, "pci": "bus three"}, "is not a PCI address"),
        (Kind.XID, {"line": "kernel: nothing to see"}, "does not read"),
        (Kind.XID, {"line": "a\nb"}, "one kernel log line"),
        (Kind.SXID, {"code": True}, "needs data.code"),
    ],
)
def test_bad_drill_data_is_a_sentence(kind: Kind, data: dict[str, object], says: str) -> None:
    with pytest.raises(DrillError, match=says):
        injected_event("node-1", InjectMsg(kind=kind, data=data))
