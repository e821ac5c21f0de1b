"""The client's own deadline check (issue #37 item 3 for the plain loop): a SIGTERM's save that its
measured p95 says cannot land before the deadline is not started; unknown deadline or no measured save
is a save, as before."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.client.deadline import SaveClock, deadline_file, known_deadline, margin_s, skip_reason
from tests.properties import examples


def no_scontrol(args: list[str], env: Mapping[str, str]) -> str | None:
    raise AssertionError("scontrol asked although the deadline file answers")


def test_a_save_clock_times_answered_saves_only() -> None:
    clock = SaveClock(keep=3)
    assert clock.p95() is None
    clock.seen(10.0)
    clock.seen(11.0)  # the loop sees the same save again: it began at 10
    clock.answered(14.0, ok=True)
    clock.answered(15.0, ok=True)  # an answer with no save seen: nothing measured
    clock.seen(20.0)
    clock.answered(90.0, ok=False)  # a failed save is not a save time
    assert clock.count == 1 and clock.p95() == 4.0
    for began, took in ((30.0, 1.0), (40.0, 2.0), (50.0, 3.0)):
        clock.seen(began)
        clock.answered(began + took, ok=True)
    assert clock.count == 3 and clock.p95() == 3.0  # keep=3: the 4 s save is forgotten


def test_skip_only_when_the_p95_and_margin_do_not_fit() -> None:
    deadline = (100.0, "Slurm EndTime x")
    assert skip_reason(80.0, deadline, 17.0, 2.0) is None  # 20 s left, 19 s needed
    why = skip_reason(80.0, deadline, 30.0, 2.0)
    assert why is not None and "20.0 s left" in why and "30.0 s (p95)" in why and "Slurm EndTime x" in why
    assert skip_reason(80.0, None, 300.0, 2.0) is None  # no deadline known: save
    assert skip_reason(80.0, deadline, None, 2.0) is None  # nothing measured: save
    assert "0.0 s left" in (skip_reason(120.0, deadline, 1.0, 2.0) or "")  # past: never a save


@settings(max_examples=examples(200))
@given(
    left=st.floats(min_value=-100, max_value=1e5, allow_nan=False),
    p95=st.floats(min_value=0, max_value=1e5, allow_nan=False),
    more=st.floats(min_value=0, max_value=1e4, allow_nan=False),
)
def test_more_time_never_turns_a_save_into_a_skip(left: float, p95: float, more: float) -> None:
    deadline = (1000.0, "d")
    now = deadline[0] - left
    if skip_reason(now, deadline, p95, 2.0) is None:
        assert skip_reason(now - more, deadline, p95, 2.0) is None
    else:  # and a skip is only ever for a save that did not fit
        assert left < p95 + 2.0


def test_the_deadline_file_comes_first_and_a_bad_one_falls_back_to_slurm(tmp_path: Path) -> None:
    now = 1796400000.0
    good = tmp_path / "deadline"
    good.write_text(f"{now + 90.5}\n")
    env = {"FTD_DEADLINE_FILE": str(good), "SLURM_JOB_ID": "7"}
    assert known_deadline(env, no_scontrol, now=now) == (now + 90.5, f"deadline file {good}")
    asked: list[list[str]] = []

    def scontrol(args: list[str], env: Mapping[str, str]) -> str | None:
        asked.append(args)
        return "JobId=7 JobState=RUNNING PreemptTime=None EndTime=2026-12-05T01:00:00 Partition=low"

    # unreadable, not a number, not finite, already past (a notice that is over), days ahead
    for text in ("soon", "nan", "inf", "", f"{now - 1}", f"{now + 2 * 86400}"):
        good.write_text(text)
        found = known_deadline(env, scontrol, now=now)
        assert found is not None and found[1] == "Slurm EndTime 2026-12-05T01:00:00", text
    missing = {"FTD_DEADLINE_FILE": str(tmp_path / "absent")}
    assert known_deadline(missing, no_scontrol, now=now) is None  # not under Slurm either: no deadline
    assert len(asked) == 6


def test_the_deadline_file_is_beside_the_agents_socket_unless_named(tmp_path: Path) -> None:
    assert deadline_file({}, str(tmp_path / "agent.sock")) == str(tmp_path / "deadline")
    assert deadline_file({"FTD_SOCKET": "/run/x/agent.sock"}) == "/run/x/deadline"
    assert deadline_file({}) == "/run/ftd/deadline"
    assert deadline_file({"FTD_DEADLINE_FILE": "/tmp/d"}, str(tmp_path / "agent.sock")) == "/tmp/d"
    (tmp_path / "deadline").write_text("1796400100\n")
    got = known_deadline({}, no_scontrol, socket_path=str(tmp_path / "agent.sock"), now=1796400000.0)
    assert got is not None and got[0] == 1796400100.0


@pytest.mark.parametrize(("raw", "want"), [("", 2.0), ("5", 5.0), ("-1", 2.0), ("nan", 2.0), ("x", 2.0)])
def test_the_margin_from_the_environment(raw: str, want: float) -> None:
    value = margin_s({"FTD_SAVE_MARGIN_S": raw})
    assert value == want and math.isfinite(value)
