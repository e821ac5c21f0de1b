"""``ftd announce`` (issue #37) against a real coordinator API (the in-process coordinator with its
aiohttp server on a free port, the CLI in a thread over HTTP), and its --in/--at parsing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.commands.announce import parse_at, parse_in
from tests.properties import examples
from tests.unit.test_actions_cli import Served, ftd, served

__all__ = ["served"]  # the fixture, used by name


async def test_announce_a_job_through_the_api(served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = await ftd(
        capsys, "announce", "--config", str(served.config), "--job", "42", "--in", "2m", "--reason", "reboot"
    )
    assert code == 0, err
    assert out.startswith("interruption operator-") and "checkpoint_restart 42" in out
    actions = [
        a for a in await served.coordinator.ledger.actions() if a.request.params.get("source") == "operator"
    ]
    assert [a.request.target for a in actions if a.request.kind == "checkpoint_restart"] == ["42"]
    assert "reboot" in actions[0].request.reason


async def test_announce_refusals(served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = await ftd(capsys, "announce", "--url", served.url, "--node", "node-1", "--in", "90s")
    assert code == 1 and "no API token" in err
    code, _, err = await ftd(
        capsys, "announce", "--config", str(served.config), "--node", "node-1", "--in", "soon"
    )
    assert code == 2 and "give a duration" in err
    at = ("--at", "2026-12-04T21:00:00")
    code, _, err = await ftd(capsys, "announce", "--config", str(served.config), "--node", "node-1", *at)
    assert code == 2 and "timezone" in err
    code, _, err = await ftd(
        capsys, "announce", "--config", str(served.config), "--node", "node-1", "--at", "2001-01-01T00:00:00Z"
    )
    assert code == 1 and "HTTP 400" in err and "in the past" in err
    code, _, err = await ftd(
        capsys, "announce", "--config", str(served.config), "--node", "node-9", "--in", "1m"
    )
    assert code == 1 and "HTTP 404" in err


@settings(max_examples=examples(200))
@given(value=st.integers(min_value=1, max_value=10**6), unit=st.sampled_from(["", "s", "m", "h"]))
def test_in_durations(value: int, unit: str) -> None:
    assert parse_in(f"{value}{unit}") == value * {"": 1, "s": 1, "m": 60, "h": 3600}[unit]


@settings(max_examples=examples(200))
@given(text=st.text(max_size=12))
def test_in_anything_else_is_a_clear_error_or_a_positive_duration(text: str) -> None:
    try:
        assert parse_in(text) > 0
    except ValueError as exc:
        assert "--in" in str(exc)


def test_at_needs_a_timezone() -> None:
    assert parse_at("2026-12-04T21:00:00Z") == 1796418000.0
    assert parse_at("2026-12-04T22:00:00+01:00") == 1796418000.0
    for bad in ("2026-12-04T21:00:00", "tomorrow"):
        with pytest.raises(ValueError):
            parse_at(bad)
