"""The cloud-notice parsers (ftd.agent.watchers.cloud_notices): documented payloads become the right
Interruption; bogus ones (past, far, malformed, huge, wrong shape) are refused with a reason; any
bytes at all give a Parsed and never raise. Payload samples are our own, written from the providers'
documented shapes."""

from __future__ import annotations

import email.utils
import json
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.agent.watchers.cloud_notices import (
    Limits,
    Parsed,
    parse_aws_rebalance,
    parse_aws_spot,
    parse_azure_scheduled,
    parse_gcp_maintenance,
    parse_gcp_preempted,
)
from ftd.events import Interruption
from tests.properties import examples

NOW = 1_796_414_400.0  # 2026-12-04T20:00:00Z
LIMITS = Limits(max_body=4096, past_slack_s=10.0, max_ahead_s=86400.0, rebalance_horizon_s=600.0)


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def rfc1123(t: float) -> str:
    return email.utils.formatdate(t, usegmt=True)


def azure_doc(*events: dict[str, object]) -> bytes:
    return json.dumps({"DocumentIncarnation": 3, "Events": list(events)}).encode()


def azure_event(event_id: str, kind: str, not_before: str, *, status: str = "Scheduled", resources=("vm-7",)):
    return {
        "EventId": event_id,
        "EventType": kind,
        "ResourceType": "VirtualMachine",
        "Resources": list(resources),
        "EventStatus": status,
        "NotBefore": not_before,
        "Description": "host update",
        "EventSource": "Platform",
        "DurationInSeconds": 30,
    }


def test_aws_spot_terminate_is_due_at_its_time() -> None:
    body = json.dumps({"action": "terminate", "time": iso(NOW + 120)}).encode()
    parsed = parse_aws_spot(body, NOW, LIMITS)
    assert parsed.error == ""
    (notice,) = parsed.notices
    assert notice.source == "aws_spot"
    assert notice.deadline == NOW + 120
    assert notice.notice_at == NOW
    assert notice.ref == f"terminate@{iso(NOW + 120)}"


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b'{"action": "reboot", "time": "2026-12-04T20:02:00Z"}', "malformed"),
        (b'{"action": "stop", "time": "soon"}', "bad_time"),
        (b'{"action": "stop"', "malformed"),
        (b"[1, 2]", "malformed"),
        (b"\xff\xfe", "malformed"),
        (json.dumps({"action": "stop", "time": iso(NOW - 3600)}).encode(), "deadline_past"),
        (json.dumps({"action": "stop", "time": "2031-01-01T00:00:00Z"}).encode(), "deadline_far"),
        (b" " * 5000, "too_large"),
    ],
)
def test_aws_spot_bogus_bodies_are_refused(body: bytes, error: str) -> None:
    parsed = parse_aws_spot(body, NOW, LIMITS)
    assert parsed.error == error
    assert parsed.notices == ()


def test_aws_rebalance_has_the_configured_horizon() -> None:
    body = json.dumps({"noticeTime": iso(NOW - 5)}).encode()
    (notice,) = parse_aws_rebalance(body, NOW, LIMITS).notices
    assert notice.source == "aws_rebalance"
    assert notice.deadline == NOW - 5 + 600
    # a recommendation from the future is not believed
    assert parse_aws_rebalance(json.dumps({"noticeTime": iso(NOW + 3600)}).encode(), NOW, LIMITS).error


def test_gcp_preempted_true_gives_thirty_seconds_and_false_nothing() -> None:
    (notice,) = parse_gcp_preempted(b"TRUE", NOW, LIMITS).notices
    assert (notice.source, notice.deadline, notice.ref) == ("gcp_preempt", NOW + 30, "preempted")
    assert parse_gcp_preempted(b"FALSE", NOW, LIMITS) == Parsed()
    assert parse_gcp_preempted(b"maybe", NOW, LIMITS).error == "malformed"


def test_gcp_maintenance_event_names_the_event() -> None:
    assert parse_gcp_maintenance(b"NONE", NOW, LIMITS) == Parsed()
    (notice,) = parse_gcp_maintenance(b"TERMINATE_ON_HOST_MAINTENANCE\n", NOW, LIMITS).notices
    assert (notice.source, notice.deadline, notice.ref) == (
        "gcp_maintenance",
        NOW + 60,
        "TERMINATE_ON_HOST_MAINTENANCE",
    )
    assert parse_gcp_maintenance(b"<html>captive portal</html>", NOW, LIMITS).error == "malformed"


def test_azure_scheduled_events_for_this_vm_only() -> None:
    body = azure_doc(
        azure_event("A1", "Preempt", rfc1123(NOW + 30)),
        azure_event("A2", "Reboot", rfc1123(NOW + 900), resources=("vm-8",)),  # another VM
        azure_event("A3", "Redeploy", "", status="Started"),  # under way: not a notice
        azure_event("A4", "Unknown", rfc1123(NOW + 30)),
    )
    parsed = parse_azure_scheduled(body, NOW, LIMITS, resource="vm-7")
    assert parsed.error == ""
    assert [(n.ref, n.deadline, n.detail) for n in parsed.notices] == [("A1", NOW + 30, "Preempt")]
    assert parse_azure_scheduled(azure_doc(), NOW, LIMITS, resource="vm-7") == Parsed()


def test_azure_bogus_event_is_refused_but_the_sane_one_kept() -> None:
    body = azure_doc(
        azure_event("B1", "Freeze", rfc1123(NOW + 15)),
        azure_event("B2", "Terminate", rfc1123(NOW + 10 * 365 * 86400)),  # years ahead
        azure_event("B3", "Reboot", "not a date"),
    )
    parsed = parse_azure_scheduled(body, NOW, LIMITS, resource="vm-7")
    assert [n.ref for n in parsed.notices] == ["B1"]
    assert parsed.error in ("deadline_far", "bad_time")
    assert parse_azure_scheduled(b'{"Events": "none"}', NOW, LIMITS).error == "malformed"


PARSERS = [
    parse_aws_spot,
    parse_aws_rebalance,
    parse_gcp_preempted,
    parse_gcp_maintenance,
    lambda b, t, lim: parse_azure_scheduled(b, t, lim, resource="vm-7"),
]

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
_shaped = st.fixed_dictionaries(
    {},
    optional={
        "action": st.sampled_from(["terminate", "stop", "hibernate", "x"]) | _json_values,
        "time": st.builds(iso, st.floats(NOW - 1e6, NOW + 1e6)) | _json_values,
        "noticeTime": st.builds(iso, st.floats(NOW - 1e6, NOW + 1e6)) | _json_values,
        "Events": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "EventId": st.text(max_size=8) | _json_values,
                    "EventType": st.sampled_from(["Preempt", "Reboot", "Freeze"]) | _json_values,
                    "EventStatus": st.just("Scheduled") | _json_values,
                    "Resources": st.just(["vm-7"]) | _json_values,
                    "NotBefore": st.builds(rfc1123, st.floats(NOW - 1e6, NOW + 1e9)) | _json_values,
                },
            ),
            max_size=4,
        )
        | _json_values,
    },
)
_bodies = (
    st.binary(max_size=300)
    | st.sampled_from([b"TRUE", b"FALSE", b"NONE", b"MIGRATE_ON_HOST_MAINTENANCE"])
    | _shaped.map(lambda d: json.dumps(d).encode())
)


@settings(max_examples=examples(400), deadline=None)
@given(body=_bodies, parser=st.sampled_from(PARSERS), now=st.floats(0, 4e9))
def test_any_bytes_give_a_notice_within_limits_or_a_clear_error(body: bytes, parser, now: float) -> None:
    parsed = parser(body, now, LIMITS)
    assert isinstance(parsed, Parsed)
    assert parsed.error == "" or parsed.error.isidentifier()
    for notice in parsed.notices:
        assert isinstance(notice, Interruption)
        assert now - LIMITS.past_slack_s <= notice.deadline <= now + LIMITS.max_ahead_s
        assert notice.ref
    if not parsed.notices:
        # nothing announced: either nothing was there (the documented "none" answers) or an error
        assert parsed.error or body.strip() in (b"FALSE", b"NONE") or b"Events" in body


def test_the_deadline_file_keeps_the_earliest_deadline_still_ahead(tmp_path: Path) -> None:
    """The machine goes at the first urgent notice: a later one does not move the deadline the node's
    processes read; one that is past (an old notice) is replaced."""
    from ftd.agent.watchers.cloud import CloudWatcher
    from ftd.config.schema import CloudConfig

    now = [1000.0]
    path = tmp_path / "deadline"

    async def emit(event: object) -> None:
        pass

    watcher = CloudWatcher(CloudConfig(), "n1", emit, clock=lambda: now[0], deadline_file=path)  # type: ignore[arg-type]
    watcher._write_deadline(path, 1120.0)
    assert float(path.read_text()) == 1120.0
    watcher._write_deadline(path, 1300.0)  # later: the first one stands
    assert float(path.read_text()) == 1120.0
    watcher._write_deadline(path, 1060.0)  # earlier: it wins
    assert float(path.read_text()) == 1060.0
    now[0] = 2000.0  # that notice is over
    watcher._write_deadline(path, 2100.0)
    assert float(path.read_text()) == 2100.0
    assert oct(path.stat().st_mode & 0o777) == "0o644"  # readable by the node's jobs
    watcher._write_deadline(tmp_path / "no-such-dir" / "deadline", 2200.0)  # never raises
